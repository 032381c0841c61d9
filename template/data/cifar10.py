"""CIFAR-10 from its python-pickle release (``cifar-10-batches-py/``), as torchvision lays it out."""

import pickle
from pathlib import Path

import numpy as np
import torch

from template.data.augment import Flip
from template.data.base import ImageDataModule, Split, split_named

FOLDER = "cifar-10-batches-py"
TRAIN_FILES = [f"data_batch_{index}" for index in range(1, 6)]
TEST_FILES = ["test_batch"]
CLASS_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


class _ArraysOnly(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only: a doctored batch file cannot run code."""

    allowed = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.allowed:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR-10 batch file")
        found = super().find_class(module, name)
        return {"_reconstruct": empty_array(found), "ndarray": ArrayClass}.get(name, found)


class ArrayClass:
    """numpy.ndarray as a batch file names it: an argument of ``_reconstruct``, never called to make an array."""

    def __new__(cls, *args, **kwargs):
        raise pickle.UnpicklingError(
            f"refusing an array of {args[:1]} made by calling numpy.ndarray: asked for, not held"
        )


def empty_array(reconstruct):
    """numpy's ``_reconstruct`` as numpy's own pickles call it: an empty array of plain values, its state then filled
    in (and checked against the bytes the file holds). Any other size is memory asked for in a few bytes of file."""

    def reconstructed(cls, shape, dtype):
        if cls is not ArrayClass or tuple(shape) != (0,) or np.dtype(dtype).hasobject:
            raise pickle.UnpicklingError(f"refusing an array of {shape} {np.dtype(dtype)} made from nothing")
        return reconstruct(np.ndarray, shape, dtype)

    return reconstructed


def label_problem(labels: object, count: int) -> str | None:
    """What is wrong with a batch's labels, if anything: they must be class indices, one an image."""
    if not (isinstance(labels, list) or isinstance(labels, np.ndarray) and labels.ndim == 1):
        return f"a {type(labels).__name__}, not a list"
    if len(labels) != count:
        return f"{len(labels)} labels for {count} images"
    # torch.long would truncate 3.7 to 3, silently; a label past the classes would fail only mid-training.
    for index, label in enumerate(labels):
        if not (type(label) is int or isinstance(label, np.integer)) or not 0 <= label < len(CLASS_NAMES):
            return f"label {index} is {label!r}"
    return None


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch file's uint8 images (N, 3, 32, 32) and int64 labels (N,); a ValueError names the file and key."""
    with path.open("rb") as file:
        batch = _ArraysOnly(file, encoding="latin1").load()
    if not isinstance(batch, dict) or not {"data", "labels"} <= set(batch):
        raise ValueError(f"{path} is not a CIFAR-10 batch: a dict with the keys data and labels")
    images = batch["data"]
    # As released, (N, 3072) uint8: a cast would wrap other integers and floor float pixels, silently.
    if not (isinstance(images, np.ndarray) and images.dtype == np.uint8 and images.shape[1:] == (3 * 32 * 32,)):
        what = f"{images.dtype} {list(images.shape)}" if isinstance(images, np.ndarray) else type(images).__name__
        raise ValueError(f"{path}: CIFAR-10 batch key 'data' must be uint8 (N, 3072) pixels, not {what}")
    if problem := label_problem(batch["labels"], len(images)):
        raise ValueError(
            f"{path}: CIFAR-10 batch key 'labels' must be integers in [0, {len(CLASS_NAMES)}), one an image: {problem}"
        )
    return images.reshape(-1, 3, 32, 32), np.asarray(batch["labels"], dtype=np.int64)


def read_batches(folder: Path, names: list[str]) -> Split:
    images, labels = zip(*(read_batch(folder / name) for name in names), strict=True)
    return torch.from_numpy(np.concatenate(images)), torch.from_numpy(np.concatenate(labels))


class CIFAR10DataModule(ImageDataModule):
    """CIFAR-10: 50,000 training and 10,000 test images of 32x32, ten classes; val is a share of train.

    Args:
        root: directory holding ``cifar-10-batches-py/``.
        download: fetch the archive into ``root`` through torchvision when it is missing.
        val_fraction: share of the training set held out for validation.
        split_seed: seed of the train/val split alone.
        batch_size, crop_padding, hflip: the standard CIFAR recipe's (512; crops padded by 4 pixels, mirrored).
        **kwargs: every other option of ImageDataModule (the augmentation, folds...).
    """

    def __init__(
        self,
        root: str = "data/cifar10",
        download: bool = False,
        val_fraction: float = 0.1,
        split_seed: int = 0,
        batch_size: int = 512,
        crop_padding: int = 4,
        hflip: Flip = True,
        **kwargs,
    ) -> None:
        super().__init__(batch_size=batch_size, crop_padding=crop_padding, hflip=hflip, **kwargs)
        self.save_hyperparameters()
        self.root = Path(root)
        self.download = download
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.num_classes = len(CLASS_NAMES)
        self.in_channels = 3
        self.image_size = (32, 32)
        self.class_names = list(CLASS_NAMES)
        self._train: Split | None = None

    def prepare_data(self) -> None:
        missing = [name for name in TRAIN_FILES + TEST_FILES if not (self.root / FOLDER / name).is_file()]
        if not missing:
            return
        if not self.download:
            raise FileNotFoundError(
                f"CIFAR-10 not found: looked for {', '.join(missing)} in {(self.root / FOLDER).resolve()}. "
                "Unpack cifar-10-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html) into "
                f"{self.root}, point data.root at its parent folder, or set data.download: true"
            )
        from torchvision.datasets import CIFAR10

        CIFAR10(str(self.root), download=True)

    def load_split(self, split: str) -> Split:
        self.prepare_data()  # checks the files when prepare_data was not called (from Python)
        folder = self.root / FOLDER
        if split in ("test", "predict"):
            return read_batches(folder, TEST_FILES)
        if self._train is None:
            self._train = read_batches(folder, TRAIN_FILES)
        images, labels = self._train
        index = torch.from_numpy(split_named(labels.numpy(), {"val": self.val_fraction}, self.split_seed)[split])
        return images[index], labels[index]
