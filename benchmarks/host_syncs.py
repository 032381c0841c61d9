"""Where a training step would make the CPU wait for the GPU: the host syncs of every step of `template fit`.

    python benchmarks/host_syncs.py --config configs/cifar10_fast.yaml --data.root DIR [fit options]
    python benchmarks/host_syncs.py --config configs/cifar10_fast.yaml --smoke    # CPU, generated CIFAR files

A host sync is an operation the CPU cannot return from before the device has caught up: reading
a value back (`.item()`, `bool(t)`, `.tolist()`, all `aten._local_scalar_dense`), an operation
whose output size depends on the data (`nonzero`, `unique`, `masked_select`, indexing with a
boolean mask) and a blocking copy from the device to the host. A dispatch mode sees every operator
the run calls. On a GPU only those on its tensors count; on the CPU every one counts, since the
same code would wait there on a GPU, and so do `.tolist()`, `.numpy()` and `.cpu()`, which call no
operator on a CPU tensor, and the operators that read a value back inside (`bincount`, `histc`
without bounds). A sync inside another operator would not be seen, and code that takes another
path on a GPU (a per-image loop for CPU tensors, say) is probed on its CPU path: a GPU run is the
proof. Each is charged to the training step it happened in (from its start to the next step's,
so its logging and the next batch's fetch, transfer and augmentation count) and to where it came
from.

Some syncs are by design and periodic: Lightning reads the logged values back at its logging
steps (`trainer.log_every_n_steps`), the progress bar reads them when it draws (a few times a
second) and the NaN guard looks every `nonfinite.check_every_n_steps` steps. Any other sync, at
any step but the run's first, is one every step pays: it is listed with its source, and the
script exits with status 1.
"""

import argparse
import os
import pickle
import sys
import tempfile
import traceback
from collections import Counter, defaultdict
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from template.cli import cli  # noqa: E402  (after the path, so that a checkout runs without installing)
from template.data.cifar10 import CLASS_NAMES, FOLDER, TEST_FILES, TRAIN_FILES  # noqa: E402

aten = torch.ops.aten
# bincount reads the largest value back inside the operator.
READS_BACK = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
              aten.repeat_interleave.Tensor, aten.equal.default, aten.bincount.default}  # fmt: skip
HISTC = aten.histc.default  # reads min and max back when not given them (both 0)
# Reads back that call no operator on a CPU tensor (on a GPU one they copy, and the copy is seen).
HOST_READS = ("tolist", "numpy", "cpu")  # np.array(t) calls t.numpy()
UNIQUE = {"_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive"}
MASK_INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
COPIES = {aten._to_copy.default, aten.copy_.default}
PERIODIC = {  # a source by design, what marks it in the stack
    "progress bar": lambda frames: any("progress" in Path(file).name for file, _ in frames),
    "NaN guard, every check_every_n_steps": lambda frames: ("nonfinite.py", "check_pending") in frames,
}
TORCH_FILES = str(Path(torch.__file__).parent) + os.sep  # not torchmetrics/ or torchvision/
OWN_FILES = (str(REPO / "template"), f"{os.sep}lightning{os.sep}", f"{os.sep}torchmetrics{os.sep}")


def on_device(tensor, device: str) -> bool:
    """Whether ``tensor`` lives where the run trains: on a CPU run every tensor stands for one on a GPU."""
    return isinstance(tensor, torch.Tensor) and (device == "cpu" or tensor.device.type == device)


def kept_on_host() -> bool:
    """Whether the value read is one that stays on the host in a GPU run too: the step count of
    torch's optimizers (a CPU tensor unless ``capturable`` or ``fused``)."""
    return any(frame.name == "_get_value" and frame.filename.endswith(f"optim{os.sep}optimizer.py")
               for frame in traceback.extract_stack(limit=8))  # fmt: skip


def is_sync(func, args, kwargs, device: str) -> bool:
    """Whether this operator, on these arguments, waits for the device of a run that trains on ``device``."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if func in READS_BACK or func.overloadpacket.__name__ in UNIQUE or (func is HISTC and args[2:4] in ((), (0, 0))):
        return any(on_device(t, device) for t in tensors) and not (device == "cpu" and kept_on_host())
    if func in MASK_INDEXING:  # x[mask] and x[mask] = v count the mask's True values first
        indices = args[1] if len(args) > 1 else []
        masks = [i for i in indices or [] if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)]
        return any(on_device(mask, device) for mask in masks)
    if func in COPIES and device != "cpu":  # a blocking copy from the device to the host (none on a CPU run)
        source = args[1] if func is aten.copy_.default else args[0]
        target = args[0].device if func is aten.copy_.default else kwargs.get("device", source.device)
        blocking = not kwargs.get("non_blocking", False) and not (len(args) > 2 and args[2] is True)
        return source.device.type == device and torch.device(target).type == "cpu" and blocking
    return False


class SyncProbe(TorchDispatchMode, L.Callback):
    """Counts host syncs per training step, with where each came from."""

    def __init__(self) -> None:
        super().__init__()
        self.step: int | None = None  # the training step now running (or whose batch is being prepared)
        self.syncs: dict[int, Counter] = defaultdict(Counter)  # step -> Counter of (source, periodic kind)
        self.log_every = 50
        self.device = "cpu"  # the device the run trains on, from the module at the start

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.step is not None and is_sync(func, args, kwargs, self.device):
            self.syncs[self.step][self.source(func.overloadpacket.__name__)] += 1
        return func(*args, **kwargs)

    def __enter__(self):
        if getattr(self, "_originals", None):
            raise RuntimeError("this SyncProbe is already running")
        mode = super().__enter__()
        self._originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, self.host_read(name, original))
        return mode

    def __exit__(self, *exc) -> None:
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
        self._originals = {}
        return super().__exit__(*exc)

    def host_read(self, name: str, original):
        """``Tensor.<name>``, counted as a sync on a CPU run (where no copy shows it)."""

        def read(tensor, *args, **kwargs):
            if self.step is not None and self.device == "cpu" and not kept_on_host():
                self.syncs[self.step][self.source(f"Tensor.{name}")] += 1
            return original(tensor, *args, **kwargs)

        return read

    @staticmethod
    def source(name: str) -> tuple[str, str | None]:
        """The nearest frame of the project, Lightning or torchmetrics that called operator or method
        ``name``, and which periodic reader (if any) is on the stack."""
        stack = traceback.extract_stack()
        while stack and (stack[-1].filename == __file__ or TORCH_FILES in stack[-1].filename):
            stack.pop()  # the probe's frames, and torch's own around the dispatch
        frames = [(Path(frame.filename).name, frame.name) for frame in stack]
        periodic = next((kind for kind, test in PERIODIC.items() if test(frames)), None)
        nearest = next((f for f in reversed(stack) if any(part in f.filename for part in OWN_FILES)), stack[-1])
        where = f"{Path(nearest.filename).name}:{nearest.lineno} {nearest.name}"
        return f"{name} from {where}", periodic

    # The window of a step: from its start to the next one's, so its logging and the next batch's
    # fetch, move and augmentation count; its epoch's last step ends at its end. Validation and
    # the epoch's start and end are outside every window.
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.log_every = trainer.log_every_n_steps
        self.device = pl_module.device.type

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self.step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if batch_idx + 1 >= trainer.num_training_batches:
            self.step = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.step = None

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.step = None

    def report(self, steps: int) -> int:
        """Print each source's syncs and at which steps; return how many steps paid a sync that is not periodic."""
        logging_steps = {s for s in range(steps) if (s + 1) % self.log_every == 0}  # global_step s + 1 logs
        by_source: dict[tuple, set] = defaultdict(set)
        for step, counter in self.syncs.items():
            for source in counter:
                by_source[source].add(step)
        device = "cpu (each would wait on a GPU)" if self.device == "cpu" else self.device
        print(f"host syncs over {steps} training steps on {device}; Lightning logs every {self.log_every} steps")
        unexpected = set()
        for (source, periodic), hit in sorted(by_source.items(), key=lambda item: (item[0][1] or "", item[0][0])):
            others = hit - logging_steps - {0}
            if periodic and len(hit) > steps / 2:  # a reader meant to be periodic that reads at most steps
                periodic, others = None, hit - {0}
            kind = periodic or ("PER STEP" if others else "logging steps" if hit - {0} else "first step")
            if not periodic:
                unexpected |= others
            shown = ", ".join(map(str, sorted(hit)[:8])) + (", ..." if len(hit) > 8 else "")
            print(f"  {len(hit):4d} steps  {kind:36}  {source}  (steps {shown})")
        print(f"steps without any host sync: {steps - len(self.syncs)} of {steps}; steps with a sync that is not "
              f"periodic: {len(unexpected)}")  # fmt: skip
        return len(unexpected)


def write_cifar(root: Path, per_file: int = 64) -> None:
    """CIFAR-10's python-pickle layout with a few random images a file: the config's data path, runnable anywhere."""
    folder = root / FOLDER
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for number, name in enumerate(TRAIN_FILES + TEST_FILES):
        labels = [(number + index) % 10 for index in range(per_file)]
        data = rng.integers(0, 256, (per_file, 3072), dtype=np.uint8)
        with (folder / name).open("wb") as file:
            pickle.dump({"batch_label": name, "labels": labels, "data": data}, file)
    with (folder / "batches.meta").open("wb") as file:
        pickle.dump({"label_names": CLASS_NAMES}, file)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true",
                        help="CPU: generated CIFAR files, ResNetSmall, batch 16, 2 epochs of 12 steps")  # fmt: skip
    options, fit_options = parser.parse_known_args()
    if options.smoke and not any(option.startswith("--config") for option in fit_options):
        parser.error("--smoke writes CIFAR-10's files for the config's CIFAR10DataModule: give the config too, "
                     "--config configs/cifar10_fast.yaml")  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        smoke = []
        if options.smoke:
            write_cifar(Path(work) / "cifar")
            smoke = ["--data.root", f"{work}/cifar", "--data.batch_size", "16", "--model.net", "template.nets.ResNetSmall",
                     "--trainer.accelerator", "cpu", "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "12",
                     "--trainer.limit_val_batches", "2"]  # fmt: skip
        probe = SyncProbe()
        with probe:
            trainer_cli = cli(["fit", *fit_options, *smoke, "--trainer.logger.init_args.save_dir", f"{work}/runs"],
                              callbacks=(probe,))  # fmt: skip
        return 1 if probe.report(trainer_cli.trainer.global_step) else 0


if __name__ == "__main__":
    sys.exit(main())
