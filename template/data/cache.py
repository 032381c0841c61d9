"""Decode-once image cache: every image decoded and resized once into a uint8 memmap.

Later runs open the array in milliseconds and index whole batches from it. The cache is
keyed by a fingerprint of the file list, sizes, modification times and the resize
settings, so a changed dataset is never served stale; it is written to a temporary file
and renamed into place, with its JSON record written last, so an interrupted build is
never trusted.
"""

import hashlib
import json
import os
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

CACHE_VERSION = 1


def fingerprint(files: list[Path], settings: dict) -> str:
    """A digest of every file's path, size and mtime plus the decode settings."""
    digest = hashlib.sha256(json.dumps({"version": CACHE_VERSION, **settings}, sort_keys=True).encode())
    for path in files:
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:24]


def decode(path: Path, size: tuple[int, int], mode: str) -> np.ndarray:
    """One image as uint8 (C, H, W): converted to ``mode`` (grey, RGBA and palette images included),
    resized to cover ``size`` and centre-cropped, so the aspect ratio is kept."""
    with Image.open(path) as image:
        image.load()  # decodes it all: a truncated file fails here, not later in training
        image = image.convert(mode)
    image = ImageOps.fit(image, (size[1], size[0]), Image.Resampling.BILINEAR)
    array = np.asarray(image, dtype=np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def _decode_one(task: tuple[int, str, tuple[int, int], str]) -> tuple[int, np.ndarray | None, str | None]:
    index, path, size, mode = task
    try:
        return index, decode(Path(path), size, mode), None
    except Exception as error:  # every unreadable file is reported, with its reason
        return index, None, f"{type(error).__name__}: {error}"


def decode_all(files: list[Path], size: tuple[int, int], mode: str, workers: int, description: str):
    """Yield (index, array or None, error or None) for every file, decoded in parallel, with progress."""
    tasks = [(index, str(path), size, mode) for index, path in enumerate(files)]
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>8.0f} images/s"),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task(description, total=len(tasks), rate=0.0)
        if workers > 1 and len(tasks) > 256:
            with get_context("fork").Pool(workers) as pool:
                for done, result in enumerate(pool.imap_unordered(_decode_one, tasks, chunksize=256), 1):
                    yield result
                    if done % 512 == 0 or done == len(tasks):
                        elapsed = progress.tasks[task].elapsed or 1e-9
                        progress.update(task, completed=done, rate=done / elapsed)
        else:
            for done, item in enumerate(tasks, 1):
                yield _decode_one(item)
                progress.update(task, completed=done, rate=done / (progress.tasks[task].elapsed or 1e-9))


def load_or_build(
    files: list[Path], size: tuple[int, int], mode: str, cache_dir: Path, workers: int, name: str
) -> tuple[np.ndarray, dict[int, str]]:
    """The uint8 (N, C, H, W) array of ``files`` and the unreadable ones ({index: reason}).

    Opens the cache when its fingerprint matches; otherwise decodes every file once and
    writes it atomically.
    """
    key = fingerprint(files, {"size": list(size), "mode": mode})
    cache_dir.mkdir(parents=True, exist_ok=True)
    array_path, record_path = cache_dir / f"{name}-{key}.npy", cache_dir / f"{name}-{key}.json"
    channels = 1 if mode == "L" else 3
    shape = (len(files), channels, *size)
    if record_path.is_file() and array_path.is_file():
        record = json.loads(record_path.read_text())
        images = np.load(array_path, mmap_mode="r")
        if list(images.shape) == record["shape"] == list(shape):
            return images, {int(index): reason for index, reason in record["invalid"].items()}

    temporary = cache_dir / f".{array_path.name}.{os.getpid()}.tmp"
    invalid: dict[int, str] = {}
    try:
        images = np.lib.format.open_memmap(temporary, mode="w+", dtype=np.uint8, shape=shape)
        for index, array, error in decode_all(files, size, mode, workers, f"caching {name} ({len(files)} images)"):
            if error is None:
                images[index] = array
            else:
                invalid[index] = error
        images.flush()
        del images
        with open(temporary, "rb+") as file:
            os.fsync(file.fileno())
        os.replace(temporary, array_path)
    finally:
        temporary.unlink(missing_ok=True)
    # The record goes last: only an array with a record is ever trusted.
    record = {"shape": list(shape), "files": [str(path) for path in files], "invalid": invalid}
    temporary_record = record_path.with_name(f".{record_path.name}.{os.getpid()}.tmp")
    temporary_record.write_text(json.dumps(record))
    os.replace(temporary_record, record_path)
    size_mb = array_path.stat().st_size / 1e6
    print(f"cached {len(files)} images of {name} in {array_path} ({size_mb:.1f} MB); later runs open it at once")
    return np.load(array_path, mmap_mode="r"), invalid
