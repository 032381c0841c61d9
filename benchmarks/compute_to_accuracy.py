"""Training compute to accuracy: the FLOPs a config trains with, and the test accuracy they buy.

    # The full run (issue 29's anchor: airbench94, 94.01% mean test accuracy with 0.36 PFLOPs of training):
    python benchmarks/compute_to_accuracy.py --data-root DIR     # DIR/cifar-10-batches-py/, or DIR/train/<class>/*.jpg
    # Development: the first N training images an epoch (and as many test images), any fit options after:
    python benchmarks/compute_to_accuracy.py --data-root DIR --subset 4096 --trainer.max_epochs 2

Counts the FLOPs of one training step of the configured run (forward, loss and backward of the configured
module at the configured batch, by ``torch.utils.flop_counter``, on the meta device: no compute), times the
steps the run takes (the last, smaller batch of an epoch counted at its own size); evaluation (validation
every epoch, the test once) is counted apart, with its test-time views. Then trains the run with ``template
fit`` (the config's device: the CPU or a GPU), evaluates the final weights on the test split once, and
prints the PFLOPs, the test accuracy, the first epoch whose validation accuracy (a split held out from
train: every choice is made on it) reached ``--target``, and the wall time, with the date, machine and
versions. On 2 CPU cores the full airbench config trains at ~320 images/s: about 30 minutes.
"""

import argparse
import csv
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import lightning
import torch
import torch.nn.functional as F
import torchvision
import yaml
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from template.cli import cli  # noqa: E402  (after the path, so that a checkout runs without installing)

DEFAULT_CONFIG = "configs/cifar10_airbench.yaml"


def data_options(root: Path, config: Path, cache_dir: Path) -> list[str]:
    """The data options for CIFAR-10 at ``root``: the config's own DataModule for the python release, or the
    same settings on an image folder (a JPEG copy), decoded once into ``cache_dir``."""
    if (root / "cifar-10-batches-py").is_dir():
        return ["--data.root", str(root)]
    if not (root / "train").is_dir():
        sys.exit(f"compute_to_accuracy.py: {root} holds neither cifar-10-batches-py/ nor train/<class>/")
    settings = yaml.safe_load(config.read_text())["data"].get("init_args", {})
    options = [
        "--data",
        "template.data.ImageFolderDataModule",
        "--data.root",
        str(root),
        "--data.cache_dir",
        str(cache_dir),
        "--data.num_workers",
        "0",
        "--data.test_fraction",
        "0",
    ]
    for key in ("batch_size", "crop_padding", "hflip", "val_fraction", "split_seed"):
        if key in settings:
            options += [
                f"--data.{key}",
                str(settings[key]).lower() if isinstance(settings[key], bool) else str(settings[key]),
            ]
    return options


def step_flops(module: torch.nn.Module, batch: int, shape: tuple[int, ...], classes: int, train: bool) -> int:
    """FLOPs of one training step (forward, loss, backward) or one forward of ``batch`` images, on meta tensors."""
    module = module.to("meta")
    images = torch.zeros(batch, *shape, device="meta")
    module.train(train)
    with FlopCounterMode(display=False) as counter:
        if train:
            logits = module(images)
            labels = torch.zeros(batch, dtype=torch.long, device="meta")
            F.cross_entropy(logits, labels, label_smoothing=module.label_smoothing).backward()
        else:
            with torch.no_grad():
                module(images)
    return counter.get_total_flops()


def count(fit_args: list[str]) -> dict:
    """The run's training and evaluation FLOPs, from the model, data and Trainer the CLI builds for it."""
    built = cli(fit_args, run=False)
    model, data, trainer = built.model, built.datamodule, built.trainer
    data.setup("fit")
    shape, batch = tuple(data.input_shape), data.device_batch_size(1)
    train_images, val_images = len(data.datasets["train"]), len(data.datasets["val"])
    full, rest = divmod(train_images, batch)
    steps = [batch] * full + ([rest] if rest >= batch / 2 else [])  # the loader's: a short last batch kept if >= half
    limit = trainer.limit_train_batches
    if isinstance(limit, int):
        steps = steps[:limit]
    elif limit < 1:
        steps = steps[: int(len(steps) * limit)]
    epochs = trainer.max_epochs
    per_step = {size: step_flops(model, size, shape, data.num_classes, train=True) for size in set(steps)}
    forward = step_flops(model, 1, shape, data.num_classes, train=False)
    views = (2 if model.flip_tta else 1) * (3 if model.tta_translate else 1)
    return {
        "steps_per_epoch": len(steps),
        "epochs": epochs,
        "images": epochs * sum(steps),
        "train_flops": epochs * sum(per_step[size] for size in steps),
        "per_image": per_step[batch] / batch if batch in per_step else per_step[max(per_step)] / max(per_step),
        "forward": forward,
        "views": views,
        "val_images": val_images,
        "train_size": train_images,
        "batch": batch,
    }


def machine() -> str:
    if torch.cuda.is_available():
        return f"GPU {torch.cuda.get_device_name()}"
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return f"CPU {cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", required=True, type=Path)
    parser.add_argument("--config", default=DEFAULT_CONFIG, type=Path)
    parser.add_argument("--subset", type=int, help="train on the first N images an epoch, test on N (development)")
    parser.add_argument("--target", type=float, default=0.94, help="validation accuracy to reach")
    parser.add_argument("--work-dir", type=Path, help="runs and the image cache go here (default: a temporary one)")
    options, extra = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as temporary:
        work = options.work_dir or Path(temporary)
        fit_args = ["--config", str(options.config), *data_options(options.data_root, options.config, work / "cache")]
        fit_args += [
            "--trainer.logger.init_args.save_dir",
            str(work / "runs"),
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.enable_model_summary",
            "false",
            *extra,
        ]
        test_args = []
        if options.subset:
            batch = count(fit_args)["batch"]
            batches = str(max(1, options.subset // batch))
            fit_args += ["--trainer.limit_train_batches", batches]
            test_args = ["--trainer.limit_test_batches", batches]
        counted = count(fit_args)
        print(f"date:      {datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}")
        print(f"machine:   {machine()}")
        print(
            f"versions:  python {platform.python_version()}, torch {torch.__version__}, torchvision "
            f"{torchvision.__version__}, lightning {lightning.__version__}"
        )
        print(f"settings:  {' '.join(fit_args)}")
        print(
            f"training:  {counted['epochs']} epochs x {counted['steps_per_epoch']} steps (batch {counted['batch']}) "
            f"of {counted['train_size']:,} training images: {counted['images']:,} images, "
            f"{counted['per_image'] / 1e9:.3f} GFLOP an image"
        )
        print(f"compute:   {counted['train_flops'] / 1e15:.4f} PFLOPs of training")
        evaluation = counted["forward"] * counted["views"] * counted["val_images"] * counted["epochs"]
        print(
            f"apart:     {evaluation / 1e15:.4f} PFLOPs of validation ({counted['views']} views of "
            f"{counted['val_images']:,} images an epoch); the test: {counted['forward'] * counted['views'] / 1e9:.3f}"
            " GFLOP an image"
        )
        sys.stdout.flush()

        command = [sys.executable, "-m", "template"]
        start = time.perf_counter()
        fit = subprocess.run([*command, "fit", *fit_args], cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if fit.returncode:
            print(fit.stdout[-4000:], fit.stderr[-4000:])
            return 1
        run_dir = Path(re.search(r"run directory\s+(\S+)", fit.stdout).group(1))
        test = subprocess.run(
            [
                *command,
                "test",
                "--ckpt_path",
                str(run_dir / "checkpoints" / "last.ckpt"),
                *[a for a in fit_args if a != "--config" and a != str(options.config)],
                *test_args,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        found = re.search(r"test/acc (\d\.\d+) on ([\d,]+) images", test.stdout)
        if test.returncode or not found:
            print(test.stdout[-4000:], test.stderr[-4000:])
            return 1
        rows = [row for row in csv.DictReader((run_dir / "metrics.csv").open()) if row.get("val/acc")]
        elapsed, reached = 0.0, None
        for row in rows:
            elapsed += float(row["train/epoch_time"])  # the epoch's training and validation
            if reached is None and float(row["val/acc"]) >= options.target:
                reached = (int(row["epoch"]) + 1, elapsed)
        speed = max(float(row["train/images_per_sec"]) for row in rows)
        curve = ", ".join(f"{float(row['val/acc']):.4f}" for row in rows)
        print(f"val/acc:   {curve} (epochs 1 to {len(rows)})")
        print(
            f"target:    val/acc >= {options.target}: "
            + (f"epoch {reached[0]} ({reached[1]:.1f} s of epochs)" if reached else "not reached")
        )
        print(
            f"test/acc:  {float(found.group(1)):.4f} on {found.group(2)} images (final weights, test split used once)"
        )
        print(f"time:      {wall:.1f} s fit wall (start-up and data included); {speed:,.0f} training images/s")
        print(f"summary:   {counted['train_flops'] / 1e15:.4f} PFLOPs -> test/acc {float(found.group(1)):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
