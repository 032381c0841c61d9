"""What `template fit` costs over the plain PyTorch loop a careful user writes by hand.

    python benchmarks/overhead.py                 # both settings, 3 alternating repeats (~6 min, 2 cores)
    python benchmarks/overhead.py --repeats 1 --epochs 2 --settings digits   # a quick look

Both train the same network on the same in-memory data for the same optimizer steps:
(a) the plain loop: zero_grad, forward, loss, backward, clip, step, scheduler step, with the
    same batched crop/flip/normalisation on the batch; eval under no_grad each epoch;
(b) `template fit` as it ships (rich progress bar, TensorBoard logger, best and last
    checkpoints, LR monitor, NaN guard, training monitor with confusion matrix and
    misclassified grid, metrics.csv, run record), run in-process through the CLI, plus
    `gradient_clip_val 1.0` so that both clip.
Each is timed at three run lengths, E and 2E full epochs and E epochs of a quarter of the
steps (limit_train_batches), so, with n the steps of an epoch:
    per step  = (T(E, n) - T(E, n/4)) / (E 3n/4)
    per epoch = (T(2E, n) - T(E, n)) / E          (the whole epoch: steps, validation, saving)
    start-up  = T(E, n) - E * per epoch
The ratio (b)/(a) is of the time per epoch: what a long run costs, start-up aside.
Differences of whole-run wall times are blurred by a shared machine's noise (a few percent
from run to run), so both figures are also measured directly: the median interval between
the starts of successive steps, and of successive epochs (training, validation and saving
of one epoch), over every run. Those medians are the steadier figures.
Settings: `digits` (the default run: 8x8 images, batch 64, tiny steps where overhead shows)
and `batch128` (the small network on 32x32 RGB images, batch 128, 16 steps an epoch).
"""

import argparse
import contextlib
import io
import platform
import statistics
import tempfile
import time

import lightning
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from template.cli import cli
from template.data import DigitsDataModule
from template.data.augment import normalize, random_crop, random_hflip
from template.data.base import ImageDataModule, Split, keep_batch
from template.module import WarmupCosine, parameter_groups
from template.nets import ResNetSmall


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


CLOCK: dict[str, list] = {"steps": [], "epochs": []}  # step start times per epoch; epoch start times


class Clock(lightning.Callback):
    """Notes when each epoch and training step of `template fit` begins, as the plain loop does."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        CLOCK["epochs"].append(time.perf_counter())
        CLOCK["steps"].append([])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        CLOCK["steps"][-1].append(time.perf_counter())


def run_once(run, *args) -> tuple[float, list[float], list[float]]:
    """Wall time of a whole run, then its step-to-step and epoch-to-epoch intervals (s)."""
    CLOCK["steps"].clear()
    CLOCK["epochs"].clear()
    start = time.perf_counter()
    run(*args)
    total = time.perf_counter() - start
    steps = [b - a for epoch in CLOCK["steps"] for a, b in zip(epoch, epoch[1:])]
    epochs = [b - a for a, b in zip(CLOCK["epochs"], CLOCK["epochs"][1:])]
    return total, steps, epochs


SETTINGS = {
    "digits": {"data": DigitsDataModule, "args": [], "epochs": 6},
    # The batch size is given: jsonargparse carries init args over from the default data class.
    "batch128": {
        "data": SyntheticDataModule,
        "args": ["--data", f"{__name__}.SyntheticDataModule", "--data.batch_size", "128"],
        "epochs": 2,
    },
}


def plain_loop(setting: str, epochs: int, steps: int) -> None:
    """(a): what a careful user writes by hand, with the template's recipe (optimizer, schedule, loss)."""
    torch.manual_seed(42)
    data = SETTINGS[setting]["data"]()
    data.setup("fit")
    train, val = data.datasets["train"], data.datasets["val"]
    net = ResNetSmall(data.num_classes, data.in_channels)
    optimizer = torch.optim.AdamW(parameter_groups(net), lr=0.003, weight_decay=0.05)
    scheduler = WarmupCosine(optimizer, epochs * steps, warmup_fraction=0.05)
    loader = DataLoader(train, data.batch_size, shuffle=True, drop_last=True, collate_fn=keep_batch)
    val_loader = DataLoader(val, data.batch_size, collate_fn=keep_batch)
    for _ in range(epochs):
        CLOCK["epochs"].append(time.perf_counter())
        CLOCK["steps"].append([])
        net.train()
        for _, (images, labels) in zip(range(steps), loader):
            CLOCK["steps"][-1].append(time.perf_counter())
            images = random_crop(images, data.crop_padding) if data.crop_padding else images
            images = random_hflip(images) if data.hflip else images
            images = normalize(images.float().div_(255), data.mean, data.std)
            loss = F.cross_entropy(net(images), labels, label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
        net.eval()
        correct = 0
        with torch.no_grad():
            for images, labels in val_loader:
                images = normalize(images.float().div_(255), data.mean, data.std)
                correct += (net(images).argmax(1) == labels).sum()
        int(correct)  # the epoch's accuracy, as a user prints it


def template_fit(setting: str, epochs: int, steps: int) -> None:
    """(b): `template fit`, as it ships, in this process."""
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
                f"--trainer.callbacks+={__name__}.Clock",
                "--trainer.logger.init_args.save_dir",
                runs,
            ]  # fmt: skip
        )


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


def measure(setting: str, epochs: int, repeats: int) -> dict:
    data = SETTINGS[setting]["data"]()
    data.setup("fit")
    steps = len(data.datasets["train"]) // data.batch_size
    short = max(2, steps // 4)
    lengths = {"E,n": (epochs, steps), "E,short": (epochs, short), "2E,n": (2 * epochs, steps)}
    times = {(loop, length): [] for loop in "ab" for length in lengths}
    gaps = {(loop, kind): [] for loop in "ab" for kind in ("step", "epoch")}  # per run: median interval
    plain_loop(setting, 1, 2)  # warm-up: allocator, kernels, imports
    template_fit(setting, 1, 2)
    for _ in range(repeats):  # (a) and (b) back to back, so drifts in machine speed hit both alike
        for length, (e, n) in lengths.items():
            for loop, run in (("a", plain_loop), ("b", template_fit)):
                total, step_gaps, epoch_gaps = run_once(run, setting, e, n)
                times[loop, length].append(total)
                gaps[loop, "step"].append(statistics.median(step_gaps))
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
        pairs = zip(gaps["a", kind], gaps["b", kind])
        result["overhead"][key] = scale * statistics.median(b - a for a, b in pairs)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--epochs", type=int, help="E, the shorter runs' epochs (default: 6 digits, 2 batch128)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating repeats; medians are reported")
    options = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"python {platform.python_version()}, torch {torch.__version__}, lightning {lightning.__version__}")  # fmt: skip
    for setting in options.settings:
        result = measure(setting, options.epochs or SETTINGS[setting]["epochs"], options.repeats)
        a, b, overhead = result["a"], result["b"], result["overhead"]
        print(f"\n{setting}: {result['steps']} steps an epoch (short runs {result['short']}), E={result['epochs']}, "
              f"medians of {options.repeats}; overhead from paired (a), (b) runs")  # fmt: skip
        print(f"{'':24}{'(a) plain loop':>16}{'(b) template fit':>18}{'overhead':>12}")
        rows = [("per_step_ms", "ms"), ("epoch_fixed_ms", "ms"), ("per_epoch_s", "s"), ("startup_s", "s"),
                ("step_interval_ms", "ms"), ("epoch_interval_s", "s")]  # fmt: skip
        for key, unit in rows:
            print(f"{key:24}{a[key]:>14.3f}{unit:>2}{b[key]:>16.3f}{unit:>2}{overhead[key]:>10.3f}{unit:>2}")
        print(
            f"{setting} per-step overhead: {overhead['per_step_ms']:.3f} ms from two run lengths, "
            f"{overhead['step_interval_ms']:.3f} ms from median step intervals"
        )
        print(
            f"{setting} ratio (b)/(a) per epoch: {1 + overhead['epoch_interval_s'] / a['epoch_interval_s']:.3f} from median "
            f"epoch intervals, {1 + overhead['per_epoch_s'] / a['per_epoch_s']:.3f} from two run lengths"
        )


if __name__ == "__main__":
    main()
