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
Each is timed at three run lengths, E and 2E full epochs and E epochs of half the steps, so:
    per step  = (T(E, n) - T(E, n/2)) / (E n/2)
    per epoch = (T(2E, n) - T(E, n)) / E          (the whole epoch: steps, validation, saving)
    start-up  = T(E, n) - E * per epoch
The ratio (b)/(a) is of the time per epoch: what a long run costs, start-up aside. As a
check on the per-step figure, which the differences of noisy wall times blur on a shared
machine, the median interval between the starts of successive steps is printed too.
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


STEP_STARTS: list[list[float]] = []  # per epoch: when each training step began


class StepClock(lightning.Callback):
    """Notes when each training step of `template fit` begins, as the plain loop does itself."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        STEP_STARTS.append([])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        STEP_STARTS[-1].append(time.perf_counter())


def median_step_ms(run, *args) -> float:
    """Median time from one training step's start to the next's: steady state, outliers aside."""
    STEP_STARTS.clear()
    run(*args)
    return 1000 * statistics.median(b - a for epoch in STEP_STARTS for a, b in zip(epoch, epoch[1:]))


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
        net.train()
        STEP_STARTS.append([])
        for _, (images, labels) in zip(range(steps), loader):
            STEP_STARTS[-1].append(time.perf_counter())
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
                f"--trainer.callbacks+={__name__}.StepClock",
                "--trainer.logger.init_args.save_dir",
                runs,
            ]  # fmt: skip
        )


def timed(run, *args) -> float:
    start = time.perf_counter()
    run(*args)
    return time.perf_counter() - start


def measure(setting: str, epochs: int, repeats: int) -> dict:
    data = SETTINGS[setting]["data"]()
    data.setup("fit")
    steps = len(data.datasets["train"]) // data.batch_size
    lengths = {"E,n": (epochs, steps), "E,n/2": (epochs, steps // 2), "2E,n": (2 * epochs, steps)}
    times = {(loop, length): [] for loop in "ab" for length in lengths}
    plain_loop(setting, 1, 2)  # warm-up: allocator, kernels, imports
    template_fit(setting, 1, 2)
    for _ in range(repeats):  # alternate, so drifts in machine speed hit both alike
        for length, (e, n) in lengths.items():
            times["a", length].append(timed(plain_loop, setting, e, n))
            times["b", length].append(timed(template_fit, setting, e, n))
    result = {"steps": steps, "epochs": epochs}
    for loop, run in (("a", plain_loop), ("b", template_fit)):  # a third, direct look at the step
        result[f"step_ms_{loop}"] = statistics.median(
            median_step_ms(run, setting, epochs, steps) for _ in range(repeats)
        )
    for loop in "ab":
        median = {length: statistics.median(times[loop, length]) for length in lengths}
        per_step = (median["E,n"] - median["E,n/2"]) / (epochs * (steps - steps // 2))
        per_epoch = (median["2E,n"] - median["E,n"]) / epochs
        result[loop] = {
            "per_step_ms": 1000 * per_step,
            "per_epoch_s": per_epoch,
            "epoch_fixed_ms": 1000 * (per_epoch - steps * per_step),  # validation, saving, logging
            "startup_s": median["E,n"] - epochs * per_epoch,
        }
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
        a, b = result["a"], result["b"]
        print(f"\n{setting}: {result['steps']} steps an epoch, E={result['epochs']}, medians of {options.repeats}")
        print(f"{'':24}{'(a) plain loop':>16}{'(b) template fit':>18}{'overhead':>12}")
        for key, unit in (("per_step_ms", "ms"), ("epoch_fixed_ms", "ms"), ("per_epoch_s", "s"), ("startup_s", "s")):
            print(f"{key:24}{a[key]:>14.3f}{unit:>2}{b[key]:>16.3f}{unit:>2}{b[key] - a[key]:>10.3f}{unit:>2}")
        step_a, step_b = result["step_ms_a"], result["step_ms_b"]
        print(f"{'median step interval':24}{step_a:>14.3f}ms{step_b:>16.3f}ms{step_b - step_a:>10.3f}ms")
        print(
            f"{setting} per-step overhead: {b['per_step_ms'] - a['per_step_ms']:.3f} ms from two run lengths, "
            f"{step_b - step_a:.3f} ms from median step intervals"
        )
        print(f"{setting} ratio (b)/(a) per epoch: {b['per_epoch_s'] / a['per_epoch_s']:.3f}")


if __name__ == "__main__":
    main()
