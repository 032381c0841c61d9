"""Images per second delivered to the model: a tutorial ImageFolder pipeline vs this project's.

    python benchmarks/data_throughput.py                 # makes a CIFAR-shaped JPEG folder (20,000 images)
    python benchmarks/data_throughput.py --root DIR      # DIR/train/<class>/*.jpg, e.g. CIFAR-10 as JPEG

(a) baseline, as a tutorial writes it: torchvision ImageFolder + PIL + transforms
    (RandomCrop(32, padding=4), RandomHorizontalFlip, ToTensor, Normalize), shuffled.
(b) this project: ImageFolderDataModule with the decode-once cache, batches indexed from
    the uint8 memmap, then random crop (reflect), flip and normalisation on whole batches
    (on_after_batch_transfer), as training runs them.
(c) the strong policy, as a tutorial writes it: (a) with TrivialAugmentWide after the flip
    and RandomErasing(0.25) after Normalize, per PIL image in the workers (transforms v2).
(d) the same policy here: (b) with policy=trivialaugment and random_erasing=0.25, on whole
    batches (in 16 groups, each with its own draws).
All use the same batch size and num_workers and are timed over full epochs; (b) and (d)
after the one-off cache build, which is timed too and compared with one baseline epoch.
"""

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torchvision
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import transforms as T
from torchvision.transforms import v2

from template.data import ImageFolderDataModule

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)
STRONG = {"policy": "trivialaugment", "random_erasing": 0.25}  # (d); (c) is the same in PIL


def make_folder(root: Path, images: int, classes: int = 10) -> None:
    rng = np.random.default_rng(0)
    for index in range(images):
        folder = root / "train" / f"class{index % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        base = rng.integers(0, 256, (1, 1, 3))
        pixels = np.clip(base + rng.normal(0, 40, (32, 32, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{index:05d}.jpg", quality=90)


class Training:
    """Stands in for the Trainer where on_after_batch_transfer asks whether it is training."""

    training = True
    world_size = 1
    global_rank = 0
    strategy = SimpleNamespace(root_device=torch.device("cpu"))


def strong_transform() -> v2.Compose:
    return v2.Compose([
        v2.RandomCrop(32, padding=4, padding_mode="reflect"), v2.RandomHorizontalFlip(), v2.TrivialAugmentWide(),
        v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD), v2.RandomErasing(0.25),
    ])  # fmt: skip


def baseline_epoch(root: Path, batch_size: int, workers: int, strong: bool = False) -> tuple[float, int]:
    transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    transform = strong_transform() if strong else transform
    dataset = torchvision.datasets.ImageFolder(str(root / "train"), transform=transform)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers, drop_last=True)
    start, seen = time.perf_counter(), 0
    for _, labels in loader:
        seen += len(labels)
    return time.perf_counter() - start, seen


def project_epochs(data: ImageFolderDataModule, epochs: int) -> tuple[float, int]:
    loader = data.train_dataloader()
    start, seen = time.perf_counter(), 0
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            images, labels = data.on_after_batch_transfer(batch, 0)  # augmentation + normalisation
            seen += len(labels)
    return time.perf_counter() - start, seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, help="an ImageFolder root with train/; made when not given")
    parser.add_argument("--images", type=int, default=20_000, help="images to make when --root is not given")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--epochs", type=int, default=3, help="epochs of (b) timed after the cache exists")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = args.root
        if root is None:
            root = Path(scratch) / "images"
            print(f"making {args.images} CIFAR-shaped JPEG files in {root} ...")
            make_folder(root, args.images)
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}")
        print(f"versions: torch {torch.__version__}, torchvision {torchvision.__version__}, Pillow {Image.__version__}")
        print(f"settings: batch {args.batch_size}, num_workers {args.workers}, torch threads {torch.get_num_threads()}")

        base_time, base_seen = baseline_epoch(root, args.batch_size, args.workers)
        baseline = base_seen / base_time
        print(
            f"(a) baseline ImageFolder + PIL transforms: {baseline:,.0f} images/s ({base_seen} images in {base_time:.1f} s)"
        )

        data = ImageFolderDataModule(
            str(root), image_size=32, batch_size=args.batch_size, num_workers=args.workers, cache=True,
            cache_dir=str(Path(scratch) / "cache"), val_fraction=max(0.02, 50 / base_seen),
        )  # fmt: skip
        data.trainer = Training()
        start = time.perf_counter()
        data.setup("fit")  # decodes every image once into the cache
        build = time.perf_counter() - start
        print(f"one-off cache build: {build:.1f} s = {build / base_time:.2f} x one baseline epoch")
        data.trainer = Training()
        time_b, seen_b = project_epochs(data, args.epochs)
        rate = seen_b / time_b
        print(
            f"(b) this project, cached + batched augmentation: {rate:,.0f} images/s ({seen_b} images in {time_b:.1f} s)"
        )
        print(f"ratio (b)/(a): {rate / baseline:.1f}x")

        strong_time, strong_seen = baseline_epoch(root, args.batch_size, args.workers, strong=True)
        strong_baseline = strong_seen / strong_time
        print(
            f"(c) strong policy, ImageFolder + PIL v2 transforms: {strong_baseline:,.0f} images/s "
            f"({strong_seen} images in {strong_time:.1f} s)"
        )
        for name, value in STRONG.items():
            setattr(data, name, value)
        time_d, seen_d = project_epochs(data, args.epochs)
        strong_rate = seen_d / time_d
        print(
            f"(d) strong policy here, cached + batched: {strong_rate:,.0f} images/s ({seen_d} images in {time_d:.1f} s)"
        )
        print(f"ratio (d)/(c): {strong_rate / strong_baseline:.1f}x (target 5x)")


if __name__ == "__main__":
    main()
