"""CIFAR-10 from its python-pickle release (``cifar-10-batches-py/``), as torchvision lays it out."""

import io
import math
import pickletools
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from template.data.augment import Flip
from template.data.base import ImageDataModule, Split, split_named
from template.files import open_regular
from template.text import printable

ANY = pickletools.anyobject
FOLDER = "cifar-10-batches-py"
TRAIN_FILES = [f"data_batch_{index}" for index in range(1, 6)]
TEST_FILES = ["test_batch"]
CLASS_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


# What a pickle of arrays holds: the plain values opcodes push from their own argument (numbers, text, bytes), empty
# containers and constants, and calls of numpy's (read as names: ``Call``).
PUSHES = {
    op.name for op in pickletools.opcodes if op.arg and not op.stack_before and op.stack_after[:1] not in ([], [ANY])
}
EMPTY = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_DICT": dict, "EMPTY_LIST": list, "EMPTY_TUPLE": tuple}
RECONSTRUCT = ("numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct")  # protocols 0 to 4
FROMBUFFER = ("numpy.core.numeric._frombuffer", "numpy._core.numeric._frombuffer")  # protocol 5
DTYPES = ("u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f4", "f8")  # numpy's plain numbers, by code


class Call:
    """A call a pickle asks for, of a function it names, and the state it then sets: recorded, never made."""

    def __init__(self, name: str, args: tuple) -> None:
        self.name, self.args, self.state = name, args, None

    def __repr__(self) -> str:
        return f"a call of {printable(self.name)}"


def read_pickle(file: BinaryIO) -> Any:
    """A pickle's values, read as data by ``pickletools``: its globals are only names and its calls ``Call``s, so
    nothing it names is imported or run, and nothing it asks for is allocated (``array_of`` builds the arrays)."""
    stack: list = []
    memo: dict = {}
    marks: list[int] = []

    def since_mark() -> list:
        items = stack[marks[-1] :]
        del stack[marks.pop() :]
        return items

    for opcode, arg, position in pickletools.genops(file):
        name = opcode.name
        if name in PUSHES:
            if type(arg) is int and arg.bit_length() > 64:  # no count or label is: math on it would cost its square
                raise ValueError(f"its pickle holds an integer of {arg.bit_length():,} bits at byte {position}")
            stack.append(arg)
        elif name in EMPTY:
            stack.append(EMPTY[name]() if isinstance(EMPTY[name], type) else EMPTY[name])
        elif name == "MARK":
            marks.append(len(stack))
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            memo[len(memo) if arg is None else arg] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo[arg])
        elif name == "GLOBAL":
            stack.append(Call(arg.replace(" ", "."), ()))
        elif name == "STACK_GLOBAL":
            attribute, module = stack.pop(), stack.pop()
            stack.append(Call(f"{module}.{attribute}", ()))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3", "TUPLE", "LIST"):
            items = since_mark() if name in ("TUPLE", "LIST") else [stack.pop() for _ in range(int(name[-1]))][::-1]
            stack.append(items if name == "LIST" else tuple(items))
        elif name in ("APPEND", "APPENDS"):
            items = since_mark() if name == "APPENDS" else [stack.pop()]
            stack[-1].extend(items)
        elif name in ("SETITEM", "SETITEMS", "DICT"):
            items = since_mark() if name != "SETITEM" else [stack.pop(-2), stack.pop()]
            if name == "DICT":
                stack.append({})
            stack[-1].update(zip(items[::2], items[1::2], strict=True))
        elif name == "REDUCE" and isinstance(stack[-1], tuple) and isinstance(stack[-2], Call) and not stack[-2].args:
            args = stack.pop()
            stack.append(Call(stack.pop().name, args))
        elif name == "BUILD" and isinstance(stack[-2], Call) and stack[-2].args and stack[-2].state is None:
            state = stack.pop()
            stack[-1].state = state
        elif name not in ("PROTO", "FRAME", "STOP"):
            raise ValueError(f"its pickle holds {name} at byte {position}, which a batch of arrays does not")
    return stack[-1]


def literal(value: Any) -> Any:
    """Bytes as protocol 2 pickles them (``_codecs.encode(text, "latin1")``) or Python 2's strings, as bytes."""
    if isinstance(value, Call) and value.name == "_codecs.encode" and len(value.args) == 2 and not value.state:
        value = value.args[0] if value.args[1] == "latin1" else None
    return (
        value.encode("latin-1") if isinstance(value, str) else bytes(value) if isinstance(value, bytearray) else value
    )


def array_of(value: Any) -> Any:
    """The numpy array a pickle's call stands for, built here from the bytes it holds as one of ``DTYPES``, checked
    against its shape; any other value as it is, and any other call refused."""
    if not isinstance(value, Call):
        return value
    args, state = value.args, value.state
    if value.name in RECONSTRUCT and len(args) == 3 and isinstance(state, tuple) and len(state) == 5:
        shape, dtype, raw = state[1], state[2], literal(state[4])
        c_order = (literal(args[1]), state[3]) == ((0,), False)  # an empty array, filled in, not Fortran-ordered
    elif value.name in FROMBUFFER and len(args) == 4 and state is None:
        raw, dtype, shape, c_order = literal(args[0]), args[1], args[2], args[3] == "C"
    else:
        raise ValueError(f"{value!r}, not a numpy array as numpy pickles one")
    order = dtype.state[1] if isinstance(dtype, Call) and isinstance(dtype.state, tuple) and dtype.state[1:] else "|"
    code = dtype.args[0] if isinstance(dtype, Call) and dtype.name == "numpy.dtype" and dtype.args else None
    if code not in DTYPES or order not in ("|", "<", "="):
        raise ValueError(
            f"an array of {printable(repr(dtype)[:100])} ({printable(str(code)[:100])}), not one of {', '.join(DTYPES)}"
        )
    if not c_order:
        raise ValueError("an array in Fortran order, or made otherwise than numpy makes one: C order only")
    dtype = np.dtype(f"<{code}")
    sizes = isinstance(shape, tuple) and len(shape) <= 32 and all(type(n) is int and 0 <= n <= len(raw) for n in shape)
    if not sizes or not isinstance(raw, bytes):
        raise ValueError(f"an array of shape {printable(repr(shape)[:200])}, not one of sizes, or without its bytes")
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"an array of {shape} {dtype} in {len(raw)} bytes of the file")
    return np.frombuffer(raw, dtype).reshape(shape)


def label_problem(labels: object, count: int) -> str | None:
    """What is wrong with a batch's labels, if anything: they must be class indices, one an image."""
    if not (isinstance(labels, list) or isinstance(labels, np.ndarray) and labels.ndim == 1):
        return f"a {type(labels).__name__}, not a list"
    if len(labels) != count:
        return f"{len(labels)} labels for {count} images"
    # torch.long would truncate 3.7 to 3, silently; a label past the classes would fail only mid-training.
    for index, label in enumerate(labels):
        if not (type(label) is int or isinstance(label, np.integer)):
            return f"label {index} is {printable(repr(label)) if type(label) in (float, str) else type(label).__name__}"
        if not 0 <= label < len(CLASS_NAMES):
            return f"label {index} is {label}"
    return None


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch file's uint8 images (N, 3, 32, 32) and int64 labels (N,); a ValueError names the file and key."""
    try:
        with open_regular(path) as file:  # read whole: a length in the pickle then allocates no more than the file
            batch = read_pickle(io.BytesIO(file.read()))
        # Keys as bytes: Python 3's pickle writes them so after pickle.load(encoding="bytes") of the release.
        if isinstance(batch, dict):
            batch = {key.decode("latin-1") if isinstance(key, bytes) else key: value for key, value in batch.items()}
        if not isinstance(batch, dict) or not {"data", "labels"} <= set(batch):
            raise ValueError("not a dict with the keys data and labels")
        images, labels = array_of(batch["data"]), array_of(batch["labels"])
    except (ValueError, TypeError, LookupError, AttributeError, RecursionError) as error:  # a damaged file's
        raise ValueError(f"{path} is not a CIFAR-10 batch: {error}; nothing in it was imported or run") from None
    # As released, (N, 3072) uint8: a cast would wrap other integers and floor float pixels, silently.
    if not (isinstance(images, np.ndarray) and images.dtype == np.uint8 and images.shape[1:] == (3 * 32 * 32,)):
        what = f"{images.dtype} {list(images.shape)}" if isinstance(images, np.ndarray) else type(images).__name__
        raise ValueError(f"{path}: CIFAR-10 batch key 'data' must be uint8 (N, 3072) pixels, not {what}")
    if problem := label_problem(labels, len(images)):
        raise ValueError(
            f"{path}: CIFAR-10 batch key 'labels' must be integers in [0, {len(CLASS_NAMES)}), one an image: {problem}"
        )
    return images.reshape(-1, 3, 32, 32), np.asarray(labels, dtype=np.int64)


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
