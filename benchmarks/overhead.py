"""What `template fit` costs over the plain PyTorch loop a careful user writes by hand.

    python benchmarks/overhead.py                 # every setting (~20 min, 2 cores)
    python benchmarks/overhead.py --repeats 1 --epochs 2 --settings linear   # a quick look

Both train the same network on the same in-memory data for the same optimizer steps:
(a) the plain loop: zero_grad, forward, loss, backward, clip, step, scheduler step, with the
    same batched crop/flip/normalisation on the batch; eval under no_grad each epoch;
(b) `template fit` as it ships (rich progress bar, TensorBoard logger, best and last
    checkpoints, LR monitor, NaN guard, training monitor with confusion matrix and
    misclassified grid, metrics.csv, run record), run in-process through the CLI, plus
    `gradient_clip_val 1.0` so that both clip.
On a shared VM the machine's speed drifts by several percent within seconds, which blurs
differences of whole-run wall times. So, two ways of measuring:
1. Paired epochs (the steady figures). One run of (b) in which, after every training epoch and
   its validation, a callback runs one epoch of (a) in the same process: pairs a fraction of a
   second apart share the drift. The per-step overhead is the median, over the pairs, of (b)'s
   mean step interval (from one step's start to the next, the steps that write metrics
   included) minus that of the (a) epoch right after it; bare Lightning is paired the same way,
   for scale. Per pair, D = (b)'s epoch time (training, validation, saving) minus (a)'s
   (training, evaluation); with medians over the pairs at two run lengths, n and n/4 steps:
       per step         = (D(n) - D(n/4)) / (3n/4)     (blurred by the fixed costs' noise)
       per epoch, fixed = D(n) - n * per step
       ratio (b)/(a)    = 1 + D(n) / (a)'s epoch time: what a long run costs, start-up aside.
   Bare Lightning's ratio is paired the same way: what Lightning's loop alone costs, for scale.
2. Separate runs, (a) and (b) alternating, at three lengths: E and 2E full epochs and E epochs
   of a quarter of the steps, with T a whole run's wall time:
       per step  = (T(E, n) - T(E, n/4)) / (E 3n/4)
       per epoch = (T(2E, n) - T(E, n)) / E
       start-up  = T(E, n) - E * per epoch
   The start-up is only measured here; the other figures carry the drift.
Settings: `linear` (the digits pipeline with a linear classifier: next to no compute, so what
is left of a step is the framework's and the data's cost, and shows without the network's
noise), `digits` (the default run: ResNetSmall on 8x8 images, batch 64, small steps) and
`batch128` (ResNetSmall on 32x32 RGB images, batch 128, 16 steps an epoch).
"""

import argparse
import contextlib
import io
import logging
import os
import platform
import statistics
import tempfile
import time
import warnings
from functools import partial

import lightning
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from template.cli import cli
from template.data import DigitsDataModule
from template.data.augment import augment, normalize
from template.data.base import ImageDataModule
from template.data.loaders import Split, keep_batch
from template.module import ClassificationModule, WarmupCosine, parameter_groups
from template.nets import ResNetSmall

# Importing Lightning set this; a hand-written script never imports it. (With it, and a CUDA
# build of torch on a machine without a GPU, every AdamW step probes for the NVIDIA library:
# `template fit` drops it on such machines too.)
os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)


class SyntheticDataModule(ImageDataModule):
    """Seeded random 32x32 RGB images in memory: CIFAR's shape without its files."""

    def __init__(self, batch_size: int = 128, train_images: int = 2048, val_images: int = 512) -> None:
        super().__init__(batch_size, crop_padding=4, hflip=True)
        self.sizes = {"train": train_images, "val": val_images, "test": val_images}
        self.num_classes, self.in_channels, self.image_size = 10, 3, (32, 32)
        self.class_names = [f"class{index}" for index in range(10)]

    def load_split(self, split: str) -> Split:
        generator = torch.Generator().manual_seed(len(split))
        images = torch.randint(0, 256, (self.sizes[split], 3, 32, 32), dtype=torch.uint8, generator=generator)
        return images, torch.randint(0, 10, (self.sizes[split],), generator=generator)


class Linear(nn.Module):
    """A linear classifier: a step's compute is next to nothing."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, pixels: int = 64) -> None:
        super().__init__()
        self.fc = nn.Linear(in_channels * pixels, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(images.flatten(1))


CLOCK: dict[str, list] = {"steps": [], "epochs": []}  # step start times per epoch; epoch start times


class Clock(lightning.Callback):
    """Notes when each epoch and training step of `template fit` begins, as the plain loop does."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        CLOCK["epochs"].append(time.perf_counter())
        CLOCK["steps"].append([])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        CLOCK["steps"][-1].append(time.perf_counter())


def step_interval(starts: list[float]) -> float:
    """Mean time from the start of one step of an epoch to the start of the next (s)."""
    return (starts[-1] - starts[0]) / (len(starts) - 1)


def run_once(run, *args) -> tuple[float, float, list[float]]:
    """Wall time of a whole run, its mean step interval and its epoch-to-epoch intervals (s)."""
    CLOCK["steps"].clear()
    CLOCK["epochs"].clear()
    start = time.perf_counter()
    run(*args)
    total = time.perf_counter() - start
    steps = statistics.fmean(step_interval(epoch) for epoch in CLOCK["steps"])
    epochs = [b - a for a, b in zip(CLOCK["epochs"], CLOCK["epochs"][1:])]
    return total, steps, epochs


SETTINGS = {
    "linear": {"data": DigitsDataModule, "net": Linear, "args": ["--model.net", f"{__name__}.Linear"], "epochs": 6},
    "digits": {"data": DigitsDataModule, "net": ResNetSmall, "args": [], "epochs": 6},
    # The batch size is given: jsonargparse carries init args over from the default data class.
    "batch128": {
        "data": SyntheticDataModule,
        "net": ResNetSmall,
        "args": ["--data", f"{__name__}.SyntheticDataModule", "--data.batch_size", "128"],
        "epochs": 2,
    },
}


class PlainLoop:
    """(a): what a careful user writes by hand, with the template's recipe (optimizer, schedule, loss)."""

    def __init__(self, setting: str, total_steps: int) -> None:
        torch.manual_seed(42)
        self.data = data = SETTINGS[setting]["data"]()
        data.setup("fit")
        self.net = SETTINGS[setting]["net"](data.num_classes, data.in_channels)
        self.optimizer = torch.optim.AdamW(parameter_groups(self.net), lr=0.003, weight_decay=0.05)
        self.scheduler = WarmupCosine(self.optimizer, total_steps, warmup_fraction=0.05)
        self.loader = DataLoader(data.datasets["train"], data.batch_size, shuffle=True, drop_last=True,
                                 collate_fn=keep_batch)  # fmt: skip
        self.val_loader = DataLoader(data.datasets["val"], data.batch_size, collate_fn=keep_batch)

    def epoch(self, steps: int) -> list[float]:
        """Train ``steps`` steps, then evaluate; returns when each step started."""
        data, net, optimizer = self.data, self.net, self.optimizer
        starts = []
        net.train()
        for _, (images, labels) in zip(range(steps), self.loader):
            starts.append(time.perf_counter())
            images = normalize(augment(images, data.crop_padding, data.hflip), data.mean, data.std)
            loss = F.cross_entropy(net(images), labels, label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            optimizer.step()
            self.scheduler.step()
        net.eval()
        correct = 0
        with torch.no_grad():
            for images, labels in self.val_loader:
                images = normalize(images.float().div_(255), data.mean, data.std)
                correct += (net(images).argmax(1) == labels).sum()
        int(correct)  # the epoch's accuracy, as a user prints it
        return starts


def plain_loop(setting: str, epochs: int, steps: int) -> None:
    loop = PlainLoop(setting, epochs * steps)
    for _ in range(epochs):
        CLOCK["epochs"].append(time.perf_counter())
        CLOCK["steps"].append(loop.epoch(steps))


def template_fit(setting: str, epochs: int, steps: int, clock: type = Clock) -> None:
    """(b): `template fit`, as it ships, in this process, plus the callback that times it."""
    with tempfile.TemporaryDirectory() as runs, contextlib.redirect_stdout(io.StringIO()):
        cli(
            [
                "fit",
                *SETTINGS[setting]["args"],
                "--trainer.max_epochs",
                str(epochs),
                "--trainer.limit_train_batches",
                str(steps),
                "--trainer.gradient_clip_val",
                "1.0",
                f"--trainer.callbacks+={__name__}.{clock.__name__}",
                "--trainer.logger.init_args.save_dir",
                runs,
            ]  # fmt: skip
        )


def bare_fit(setting: str, epochs: int, steps: int, clock: type = Clock) -> None:
    """Bare Lightning, for scale: a Trainer with the same module, data and clipping, and no
    logger, checkpoints, progress bar, model summary or callbacks of the template's."""
    data = SETTINGS[setting]["data"]()
    module = ClassificationModule(
        SETTINGS[setting]["net"](data.num_classes, data.in_channels),
        num_classes=data.num_classes,
        optimizer=partial(torch.optim.AdamW, lr=0.003, weight_decay=0.05),
        lr_scheduler=partial(WarmupCosine, warmup_fraction=0.05),
        label_smoothing=0.1,
    )
    trainer = lightning.Trainer(
        max_epochs=epochs, limit_train_batches=steps, gradient_clip_val=1.0, callbacks=[clock()],
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(module, datamodule=data)


PAIRED: dict = {"loop": None, "steps": 0, "plain": []}  # the (a) loop run between (b)'s epochs; its epochs


class PairedEpochs(Clock):
    """Times (b), and runs one epoch of (a) after each of its training epochs (and validation).
    One callback, not two: each costs (b) a little at every hook of every step."""

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        start = time.perf_counter()
        steps = PAIRED["loop"].epoch(PAIRED["steps"])
        PAIRED["plain"].append((steps, time.perf_counter() - start))


def paired_epochs(setting: str, epochs: int, steps: int, fit=template_fit) -> dict[str, list[float]]:
    """Per pair of a (b) epoch and the (a) epoch right after it, the differences (s) of their
    mean step intervals ("step") and of their whole durations ("epoch": training, evaluation,
    and for (b) saving; the time from one (b) epoch's start to the next, less the (a) epoch)."""
    PAIRED.update(loop=PlainLoop(setting, epochs * steps), steps=steps, plain=[])
    CLOCK["steps"].clear()
    CLOCK["epochs"].clear()
    fit(setting, epochs, steps, clock=PairedEpochs)
    differences = {"step": [], "epoch": [], "plain_epoch": []}
    for index in range(1, epochs - 1):  # the first epoch warms both up; the last has no next start
        (a_steps, a_time), b_steps = PAIRED["plain"][index], CLOCK["steps"][index]
        b_time = CLOCK["epochs"][index + 1] - CLOCK["epochs"][index] - a_time
        differences["step"].append(step_interval(b_steps) - step_interval(a_steps))
        differences["epoch"].append(b_time - a_time)
        differences["plain_epoch"].append(a_time)
    return differences


def epoch_ratio(differences: dict[str, list[float]]) -> float:
    """A (b) epoch's duration over the (a) epoch's, from ``paired_epochs``' differences."""
    return 1 + statistics.median(differences["epoch"]) / statistics.median(differences["plain_epoch"])


def spread(values: list[float], scale: float = 1000) -> dict[str, float]:
    """Median and quartiles, scaled (to ms)."""
    low, _, high = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return {"median": scale * statistics.median(values), "low": scale * low, "high": scale * high}


def decompose(totals: dict[str, float], epochs: int, steps: int, short: int) -> dict[str, float]:
    """Per-step, per-epoch and start-up time from the three run lengths' wall times (s)."""
    per_step = (totals["E,n"] - totals["E,short"]) / (epochs * (steps - short))
    per_epoch = (totals["2E,n"] - totals["E,n"]) / epochs
    return {
        "per_step_ms": 1000 * per_step,
        "epoch_fixed_ms": 1000 * (per_epoch - steps * per_step),  # validation, saving, logging
        "per_epoch_s": per_epoch,
        "startup_s": totals["E,n"] - epochs * per_epoch,
    }


def measure(setting: str, epochs: int, repeats: int, pairs: int) -> dict:
    data = SETTINGS[setting]["data"]()
    data.setup("fit")
    steps = len(data.datasets["train"]) // data.batch_size
    short = max(2, steps // 4)
    lengths = {"E,n": (epochs, steps), "E,short": (epochs, short), "2E,n": (2 * epochs, steps)}
    times = {(loop, length): [] for loop in "ab" for length in lengths}
    gaps = {(loop, kind): [] for loop in "ab" for kind in ("step", "epoch")}  # per run
    plain_loop(setting, 1, 2)  # warm-up: allocator, kernels, imports
    template_fit(setting, 1, 2)
    for _ in range(repeats):  # (a) and (b) back to back, so drifts in machine speed hit both alike
        for length, (e, n) in lengths.items():
            for loop, run in (("a", plain_loop), ("b", template_fit)):
                total, step_gap, epoch_gaps = run_once(run, setting, e, n)
                times[loop, length].append(total)
                gaps[loop, "step"].append(step_gap)
                if n == steps and epoch_gaps:  # whole epochs only
                    gaps[loop, "epoch"].append(statistics.median(epoch_gaps))
    result = {"steps": steps, "epochs": epochs, "short": short}
    for loop in "ab":
        result[loop] = decompose({k: statistics.median(times[loop, k]) for k in lengths}, epochs, steps, short)
        result[loop]["step_interval_ms"] = 1000 * statistics.median(gaps[loop, "step"])
        result[loop]["epoch_interval_s"] = statistics.median(gaps[loop, "epoch"])
    # The overhead from paired differences, each (b) run against the (a) run just before it.
    paired = {k: statistics.median(b - a for a, b in zip(times["a", k], times["b", k])) for k in lengths}
    result["overhead"] = decompose(paired, epochs, steps, short)
    for kind, key, scale in (("step", "step_interval_ms", 1000), ("epoch", "epoch_interval_s", 1)):
        result["overhead"][key] = scale * statistics.median(b - a for a, b in zip(gaps["a", kind], gaps["b", kind]))
    # Paired epochs at two lengths: the per-epoch difference is fixed + steps x per step.
    full, part = (paired_epochs(setting, pairs + 2, n) for n in (steps, short))
    per_step = (statistics.median(full["epoch"]) - statistics.median(part["epoch"])) / (steps - short)
    result["paired"] = {
        "per_step_ms": 1000 * per_step,
        "epoch_fixed_ms": 1000 * (statistics.median(full["epoch"]) - steps * per_step),
        "interval": spread(full["step"]),
        "pairs": pairs,
        "ratio": epoch_ratio(full),
    }
    bare = paired_epochs(setting, pairs + 2, steps, bare_fit)
    result["bare"] = spread(bare["step"])
    result["bare"]["ratio"] = epoch_ratio(bare)
    return result


def main() -> None:
    for name in ("lightning.pytorch", "lightning.fabric"):  # the figures only: no per-run banners
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")  # upstream deprecations, once a run
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--epochs", type=int, help="E, the separate runs' epochs (default: 6; batch128 2)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating repeats of the separate runs")
    parser.add_argument("--pairs", type=int, help="paired epochs (default: 40; batch128 12)")
    options = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"python {platform.python_version()}, torch {torch.__version__}, lightning {lightning.__version__}")  # fmt: skip
    for setting in options.settings:
        epochs = options.epochs or SETTINGS[setting]["epochs"]
        pairs = options.pairs or (12 if setting == "batch128" else 40)
        result = measure(setting, epochs, options.repeats, pairs)
        a, b, overhead, paired, bare = (result[key] for key in ("a", "b", "overhead", "paired", "bare"))
        print(f"\n{setting}: {result['steps']} steps an epoch; separate runs (short ones {result['short']} steps an "
              f"epoch), E={epochs}, medians of {options.repeats}, overhead from (a), (b) back to back")  # fmt: skip
        print(f"{'':24}{'(a) plain loop':>16}{'(b) template fit':>18}{'overhead':>12}")
        rows = [("per_step_ms", "ms"), ("epoch_fixed_ms", "ms"), ("per_epoch_s", "s"), ("startup_s", "s"),
                ("step_interval_ms", "ms"), ("epoch_interval_s", "s")]  # fmt: skip
        for key, unit in rows:
            print(f"{key:24}{a[key]:>14.3f}{unit:>2}{b[key]:>16.3f}{unit:>2}{overhead[key]:>10.3f}{unit:>2}")
        interval = paired["interval"]
        print(
            f"{setting} per-step overhead: {interval['median']:.3f} ms from {paired['pairs']} paired epochs' step "
            f"intervals (quartiles {interval['low']:.3f} to {interval['high']:.3f}); {paired['per_step_ms']:.3f} ms "
            f"from two run lengths of them ({result['steps']} and {result['short']} steps; fixed "
            f"{paired['epoch_fixed_ms']:.1f} ms an epoch); from separate runs {overhead['per_step_ms']:.3f} ms "
            f"(run lengths), {overhead['step_interval_ms']:.3f} ms (step intervals)"
        )
        print(
            f"{setting} bare Lightning, for scale: {bare['median']:.3f} ms a step over the plain loop "
            f"(quartiles {bare['low']:.3f} to {bare['high']:.3f}), from paired step intervals; ratio per epoch "
            f"{bare['ratio']:.3f} from paired epochs"
        )
        print(
            f"{setting} ratio (b)/(a) per epoch: {paired['ratio']:.3f} from paired epochs; from separate runs "
            f"{1 + overhead['epoch_interval_s'] / a['epoch_interval_s']:.3f} (median epoch intervals), "
            f"{1 + overhead['per_epoch_s'] / a['per_epoch_s']:.3f} (run lengths)"
        )


if __name__ == "__main__":
    main()
