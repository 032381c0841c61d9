import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest

from template.data import CIFAR10DataModule
from template.data.cifar10 import CLASS_NAMES, FOLDER, TEST_FILES, TRAIN_FILES, read_batch


def write_cifar(root, per_file=20):
    """The python-pickle layout of CIFAR-10, as the original release ships it, with tiny batches."""
    folder = root / FOLDER
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for number, name in enumerate(TRAIN_FILES + TEST_FILES):
        labels = [(number + i) % 10 for i in range(per_file)]
        batch = {"batch_label": name, "labels": labels, "data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8)}
        with (folder / name).open("wb") as file:
            pickle.dump(batch, file)
    with (folder / "batches.meta").open("wb") as file:
        pickle.dump({"label_names": CLASS_NAMES}, file)
    return root


def test_reads_the_pickle_layout(tmp_path):
    data = CIFAR10DataModule(root=str(write_cifar(tmp_path)), batch_size=8, val_fraction=0.2)
    data.setup("fit")
    assert len(data.datasets["train"]) == 80 and len(data.datasets["val"]) == 20  # 5 files of 20
    images, labels = next(iter(data.train_dataloader()))
    assert images.shape == (8, 3, 32, 32) and str(images.dtype) == "torch.uint8"
    data.setup("test")
    assert len(data.datasets["test"]) == 20
    assert data.class_names[0] == "airplane" and data.num_classes == 10


def test_missing_files_say_where_it_looked_and_how_to_get_them(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"CIFAR-10 not found: looked for data_batch_1.*cifar-10-batches-py.*download"
    ):
        CIFAR10DataModule(root=str(tmp_path)).prepare_data()


def python2_batch(images: np.ndarray, labels: list[int]) -> bytes:
    """A batch as the release has it: written by Python 2's cPickle (protocol 2, byte strings as BINSTRING)."""
    text = lambda value: b"U" + bytes([len(value)]) + value  # noqa: E731  (SHORT_BINSTRING)
    dtype = (
        b"cnumpy\ndtype\n"
        + text(b"u1")
        + b"K\x00K\x01\x87R(K\x03"
        + text(b"|")
        + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    )
    shape = b"K\x01" + b"".join(b"M" + struct.pack("<H", n) for n in images.shape) + b"\x86"
    array = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + text(b"b") + b"\x87R(" + shape
    array += dtype + b"\x89T" + struct.pack("<I", images.nbytes) + images.tobytes() + b"tb"
    label_list = b"](" + b"".join(b"K" + bytes([label]) for label in labels) + b"e"
    return b"\x80\x02}(" + text(b"data") + array + text(b"labels") + label_list + b"u."


def test_reads_the_release_as_python_2_wrote_it(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (20, 3072), dtype=np.uint8)
    path = tmp_path / "data_batch_1"
    path.write_bytes(python2_batch(images, list(range(10)) * 2))
    assert pickle.loads(path.read_bytes(), encoding="latin1")["data"].tobytes() == images.tobytes()  # as pickle reads
    read, labels = read_batch(path)
    assert np.array_equal(read, images.reshape(-1, 3, 32, 32)) and labels.tolist() == list(range(10)) * 2


def test_reads_batches_written_again_by_python_3_with_bytes_keys(tmp_path):
    """pickle.load(encoding="bytes") of the release gives b"data" and b"labels", which pickle.dump writes as bytes:
    "not a dict with the keys data and labels", of a dict holding them."""
    path = tmp_path / "data_batch_1"
    images = np.random.default_rng(0).integers(0, 256, (4, 3072), dtype=np.uint8)
    path.write_bytes(pickle.dumps({b"batch_label": b"x", b"labels": [1, 2, 3, 4], b"data": images}))
    read, labels = read_batch(path)
    assert (read.reshape(4, -1) == images).all() and labels.tolist() == [1, 2, 3, 4]


def test_a_doctored_batch_file_is_refused_not_run(tmp_path):
    root = write_cifar(tmp_path)
    marker = tmp_path / "code-ran"
    payload = type("Payload", (), {"__reduce__": lambda self: (__import__("os").system, (f"touch {marker}",))})
    with (root / FOLDER / "test_batch").open("wb") as file:
        pickle.dump({"data": payload(), "labels": []}, file)
    data = CIFAR10DataModule(root=str(root))
    with pytest.raises(ValueError, match="not a CIFAR-10 batch: a call of posix.system, not a numpy array"):
        data.setup("test")
    assert not marker.exists()


@pytest.mark.parametrize("length", [1 << 40, sys.maxsize])
def test_a_length_past_the_files_end_is_refused_as_damage_not_allocated(tmp_path, length):
    path = tmp_path / "data_batch_1"
    path.write_bytes(b"\x80\x04\x8e" + struct.pack("<Q", length) + b"abc")  # BINBYTES8 of a terabyte, 3 bytes held
    with pytest.raises(ValueError, match=f"not a CIFAR-10 batch: expected {length} bytes in a bytes8, but only 3"):
        read_batch(path)  # was a MemoryError or OverflowError: the reader allocated the length first


def test_a_few_kilobytes_that_would_cost_minutes_or_a_traceback_are_refused_at_once(tmp_path):
    """A shape of one 8,000-bit integer, memoised and named again 2,000 times (5 KB: its product took 27 s and
    quadrupled with each doubling), and a dtype argument nested 200,000 deep (its repr: a RecursionError)."""
    huge = (2**7998 + 1).to_bytes(1000, "little")
    shape = b"(\x8b" + struct.pack("<I", len(huge)) + huge + b"q\x01" + b"h\x01" * 1999 + b"t"  # MARK LONG4 ... TUPLE
    array = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85C\x01b\x87R(K\x01" + shape
    array += b"cnumpy\ndtype\nX\x02\x00\x00\x00u1\x89\x88\x87R\x89C\x00tb"
    nested = b"cnumpy\ndtype\n" + b"]" * 200_000 + b"a" * 199_999 + b"\x85R"  # a list in a list ... as its argument
    bomb = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85C\x01b\x87R(K\x01K\x01\x85" + nested
    for name, body, said in (("big", array, "an integer of 7,999 bits"), ("deep", bomb + b"\x89C\x00tb", "recursion")):
        path = tmp_path / name
        path.write_bytes(b"\x80\x02}(X\x04\x00\x00\x00data" + body + b"X\x06\x00\x00\x00labels]u.")
        with pytest.raises(ValueError, match=f"not a CIFAR-10 batch: .*{said}") as refused:
            read_batch(path)  # refused before any arithmetic on the integer, or any repr of the nesting
        assert len(str(refused.value)) < 1000, name  # not megabytes of digits


def test_a_batch_file_that_reshapes_a_dtype_is_refused_not_read_as_pointers(tmp_path):
    """numpy.dtype("V8") rebuilt by the pickle's BUILD into an object field that says it holds none: its array's
    bytes would be read as pointers the file chose (a crash, at best)."""
    raw = (0x4141414141414141).to_bytes(8, "little") * 20
    state = (3, "|", None, ("a",), {"a": (np.dtype("O"), 0)}, 8, 1, 0)
    dtype = type("Dtype", (), {"__reduce__": lambda self: (np.dtype, ("V8", False, True), state)})
    reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]
    array = type(
        "Array",
        (),
        {"__reduce__": lambda self: (reconstruct, (np.ndarray, (0,), b"b"), (1, (20,), dtype(), False, raw))},
    )
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({"data": np.zeros((20, 3072), np.uint8), "labels": array()}, protocol=4))
    code = f"from template.data.cifar10 import read_batch; from pathlib import Path; read_batch(Path({str(path)!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "not a CIFAR-10 batch: an array of a call of numpy.dtype (V8)" in done.stderr


def test_a_batch_file_asking_for_memory_it_does_not_hold_is_refused_before_it_is_allocated(tmp_path):
    root = write_cifar(tmp_path)
    reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's own array reconstructor
    for shape, dtype in (((1 << 40,), np.dtype("O")), ((1 << 40,), np.dtype(np.uint8)), ((0,), np.dtype("O"))):
        bomb = type("Bomb", (), {"__reduce__": lambda self, s=shape, d=dtype: (reconstruct, (np.ndarray, s, d))})
        with (root / FOLDER / "test_batch").open("wb") as file:
            pickle.dump({"data": bomb(), "labels": []}, file)  # a few bytes asking for a terabyte
        with pytest.raises(ValueError, match="not a CIFAR-10 batch: (an array of|a call of)"):
            CIFAR10DataModule(root=str(root)).setup("test")
    bomb = type("Bomb", (), {"__reduce__": lambda self: (np.ndarray, ((1 << 40,), "B"))})  # the class itself, called
    with (root / FOLDER / "test_batch").open("wb") as file:
        pickle.dump({"data": bomb(), "labels": []}, file)
    with pytest.raises(ValueError, match="not a CIFAR-10 batch: a call of numpy.ndarray, not a numpy array"):
        CIFAR10DataModule(root=str(root)).setup("test")


@pytest.mark.parametrize(
    "key, value",
    [
        ("labels", [3.7] * 20),  # torch.long would make them 3
        ("labels", [True] * 20),
        ("labels", np.full(20, 2.0)),
        ("labels", [10] * 20),  # past the ten classes
        ("labels", [-1] * 20),
        ("labels", [0] * 19),  # one short of the images
        ("labels", "0" * 20),
        ("data", np.full((20, 3072), 0.9)),  # [0, 1] floats: a cast to uint8 makes them 0
        ("data", np.full((20, 3072), 300)),  # wraps to 44 as uint8
        ("data", np.zeros((20, 3000), dtype=np.uint8)),
    ],
)
def test_a_batch_file_with_labels_or_pixels_a_cast_would_change_is_refused_by_name(tmp_path, key, value):
    root = write_cifar(tmp_path)
    batch = {"labels": [0] * 20, "data": np.zeros((20, 3072), dtype=np.uint8), key: value}
    with (root / FOLDER / "test_batch").open("wb") as file:
        pickle.dump(batch, file)
    with pytest.raises(ValueError, match=rf"test_batch: CIFAR-10 batch key '{key}' must be "):
        CIFAR10DataModule(root=str(root)).setup("test")
