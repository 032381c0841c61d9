"""Decode-once image cache: every image decoded and resized once into a uint8 memmap, keyed by the files' paths,
sizes and times and the resize settings. Files are renamed into place, the JSON record last, so an interrupted
build is never trusted; a damaged one is named in a warning and rebuilt."""

import functools
import hashlib
import json
import os
import shutil
from contextlib import nullcontext, suppress
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from lightning.pytorch.utilities import rank_zero_warn
from PIL import Image, ImageOps
from rich.filesize import decimal
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from template.data.images import open_image
from template.files import read_at_most, replaced_atomically, write_atomic

CACHE_VERSION = 4  # raised whenever what a cache holds or how it is checked changes: older caches are rebuilt
DISK_SHARE = 0.9  # the most of the free disk space a cache may take: the rest is for checkpoints and logs
# The most a JSON record may take, read whole: its shape and checksum, then per file its path twice (the list, the
# reason; 4,096 bytes each at most, PATH_MAX, tripled by \u escapes) and the reason's words. More is damage: rebuilt.
RECORD_BYTES, RECORD_BYTES_PER_FILE = 1 << 20, 32 << 10
KEY_BYTES = 32


class CacheUnavailable(OSError):
    """No cache can be built or trusted here; nothing was written."""


class CacheTooLarge(CacheUnavailable):
    """The cache would not fit the free disk space; nothing was written."""


def fingerprint(files: list[Path], settings: dict) -> str:
    """A digest of every file's path, inode, size, mtime and ctime plus the decode settings: new pixels of the same
    size under an old mtime (``cp -p``, tar, a fixed-size format) still change the ctime, which no one sets."""
    # Whose: a cache folder several users share holds one cache of each, rather than each rebuilding the other's.
    owner = hashlib.sha256(cache_key() or b"").hexdigest()[:16]
    digest = hashlib.sha256(json.dumps({"version": CACHE_VERSION, "owner": owner, **settings}, sort_keys=True).encode())
    for path in files:
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_ino}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ctime_ns}\n".encode())
    return digest.hexdigest()[:24]


@functools.cache
def cache_key() -> bytes | None:
    """This user's secret for the caches' checksums (``~/.cache/<package>/cache.key``, owner-only): a cache written
    elsewhere, pixels and checksum together, matches nothing made here. None where no folder of the user's holds it."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    path = Path(base, __package__.partition(".")[0], "cache.key")
    try:
        if not path.is_absolute():
            raise OSError("not an absolute path")  # no home but the working directory, which is anyone's
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".cache.key.{os.getpid()}.tmp")
            temporary.unlink(missing_ok=True)
            with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
                file.write(os.urandom(KEY_BYTES))
                os.fsync(file.fileno())  # whole on disk before it is linked into place
            with suppress(FileExistsError):  # another process (a DDP rank) made it first: theirs
                os.link(temporary, path)  # whole or not at all, never replaced
            temporary.unlink()
        if len(key := read_at_most(path, KEY_BYTES)) != KEY_BYTES:
            raise ValueError(f"{len(key)} bytes, not {KEY_BYTES}")
        return key
    except (OSError, ValueError) as error:
        rank_zero_warn(
            f"the image cache's key {path} cannot be made or read ({error}): no cache is built or trusted, images are "
            "decoded every epoch; set XDG_CACHE_HOME to a folder of yours you may write"
        )
        return None


def checksum(images: np.ndarray | None, values: dict) -> str:
    """A digest of a record's ``values`` and the pixels, keyed with ``cache_key``: finds damage, and a cache from
    elsewhere (a stranger's pixels, or unreadable files they listed) as if it were."""
    digest = hashlib.blake2b(json.dumps(values, sort_keys=True).encode(), key=cache_key(), digest_size=16)
    if images is not None:
        digest.update(memoryview(images.reshape(-1)))
    return f"blake2b:{digest.hexdigest()}"


def decode(path: Path, size: tuple[int, int], mode: str, interpolation: str = "bilinear") -> np.ndarray:
    """One image as uint8 (C, H, W): resized (bilinear or bicubic) to cover ``size`` (H, W), centre-cropped."""
    resample = Image.Resampling[interpolation.upper()]
    image = ImageOps.fit(open_image(path, mode, draft=max(size)), (size[1], size[0]), resample)
    array = np.array(image, dtype=np.uint8)  # writable: torch.from_numpy warns of Pillow's read-only buffer
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def _decode_one(task: tuple[int, str, tuple[int, int], str, str]) -> tuple[int, np.ndarray | None, str | None]:
    index, path, size, mode, interpolation = task
    try:
        return index, decode(Path(path), size, mode, interpolation), None
    except Exception as error:  # every unreadable file is reported, with its reason
        return index, None, f"{type(error).__name__}: {error}"


def decode_all(
    files: list[Path], size: tuple[int, int], mode: str, workers: int, description: str, interpolation="bilinear"
):
    """Yield (index, array or None, error or None) for every file, decoded in parallel, with progress."""
    tasks = [(index, str(path), size, mode, interpolation) for index, path in enumerate(files)]
    rate = TextColumn("{task.fields[rate]:>8.0f} images/s")
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), rate, TimeRemainingColumn()]
    parallel = workers > 1 and len(tasks) > 64
    with Progress(*columns) as progress, get_context("fork").Pool(workers) if parallel else nullcontext() as pool:
        task = progress.add_task(description, total=len(tasks), rate=0.0)
        # At most 256 a chunk, and 8 chunks a worker, so none idles at the end while another decodes its last.
        chunk = max(1, min(256, len(tasks) // (8 * workers))) if parallel else 1
        results = pool.imap_unordered(_decode_one, tasks, chunksize=chunk) if parallel else map(_decode_one, tasks)
        for done, result in enumerate(results, 1):
            yield result
            if done % 64 == 0 or done == len(tasks) or not parallel:
                progress.update(task, completed=done, rate=done / (progress.tasks[task].elapsed or 1e-9))


def read_record(path: Path, files: int) -> dict:
    """A JSON record of the cache of ``files`` files; ValueError names the file when it is not one."""
    try:
        record = json.loads(read_at_most(path, RECORD_BYTES + files * RECORD_BYTES_PER_FILE))
    except (OSError, ValueError, RecursionError) as error:  # a missing file, a cut-off write, not text, too deep
        raise ValueError(f"{path} is unreadable ({type(error).__name__}: {error})") from error
    if not isinstance(record, dict):
        raise ValueError(f"{path} holds a {type(record).__name__}, not a record")
    return record


def recorded_invalid(path: Path, count: int, values: dict, images: np.ndarray | None, what: str) -> dict[int, str]:
    """The unreadable files ({index: reason}) of ``count`` that the record ``path`` lists, once it holds ``values``
    and its checksum matches them and ``images`` (``what``, named if not); ValueError says which is wrong."""
    record = read_record(path, count)
    for key, value in values.items():  # a missing key reads as None: refused like a wrong value
        if record.get(key) != value:
            raise ValueError(f"{path} records the {key} {record.get(key)}, not {value}")
    entries = record.get("invalid")
    if not isinstance(entries, dict) or not all(
        index.isdigit() and int(index) < count and isinstance(reason, str) for index, reason in entries.items()
    ):
        raise ValueError(f"{path} does not list unreadable files as {{index below {count}: reason}}")
    if checksum(images, values | {"invalid": entries}) != record.get("checksum"):
        raise ValueError(f"{what} does not match the checksum in {path}: changed, or made elsewhere")
    return {int(index): reason for index, reason in entries.items()}


def write_record(path: Path, values: dict, images: np.ndarray | None, invalid: dict[int, str], **extra) -> None:
    """The record ``recorded_invalid`` reads: ``values``, ``invalid`` and their checksum (with ``images``)."""
    values = values | {"invalid": {str(index): reason for index, reason in invalid.items()}}
    write_atomic(path, json.dumps(values | {"checksum": checksum(images, values)} | extra))


def open_cache(array_path: Path, record_path: Path, shape: tuple[int, ...]) -> tuple[np.ndarray, dict[int, str]]:
    """The cached array and its unreadable files, each checked; ValueError says which is wrong and how."""
    try:
        if not array_path.is_file():
            raise OSError(f"{array_path} is no regular file")
        images = np.load(array_path, mmap_mode="r")
    except (OSError, ValueError) as error:  # a truncated array: "mmap length is greater than file size"
        raise ValueError(f"{array_path} is unreadable ({type(error).__name__}: {error})") from error
    if images.shape != shape or images.dtype != np.uint8:
        raise ValueError(f"{array_path} holds {images.dtype} {list(images.shape)}, not uint8 {list(shape)}")
    return images, recorded_invalid(record_path, shape[0], {"shape": list(shape)}, images, str(array_path))


def load_or_build(
    files: list[Path], size: tuple[int, int], mode: str, cache_dir: Path, workers: int, name: str, interpolation: str
) -> tuple[np.ndarray, dict[int, str]]:
    """The uint8 (N, C, H, W) array of ``files`` and the unreadable ones ({index: reason}): the cache when it
    matches and is whole, else decoded and written (CacheTooLarge first when it would not fit)."""
    settings = {"size": list(size), "mode": mode} | ({} if interpolation == "bilinear" else {"resample": interpolation})
    if cache_key() is None:
        raise CacheUnavailable("the image cache has no key (XDG_CACHE_HOME)")
    key = fingerprint(files, settings)
    cache_dir.mkdir(parents=True, exist_ok=True)
    array_path, record_path = cache_dir / f"{name}-{key}.npy", cache_dir / f"{name}-{key}.json"
    shape = (len(files), 1 if mode == "L" else 3, *size)
    if array_path.exists() or record_path.exists():
        try:
            return open_cache(array_path, record_path, shape)
        except ValueError as damage:
            rank_zero_warn(f"the image cache of {name} is incomplete or damaged, so it is rebuilt: {damage}")
    needed, free = int(np.prod(shape)), shutil.disk_usage(cache_dir).free
    if needed > DISK_SHARE * free:
        raise CacheTooLarge(
            f"the image cache of {name} would take {decimal(needed)}, but {cache_dir} has {decimal(free)} free "
            f"(a cache may take {DISK_SHARE:.0%} of it)"
        )
    invalid: dict[int, str] = {}
    with replaced_atomically(array_path) as temporary:
        images = np.lib.format.open_memmap(temporary, mode="w+", dtype=np.uint8, shape=shape)
        description = f"caching {name} ({len(files)} images)"
        for index, array, error in decode_all(files, size, mode, workers, description, interpolation):
            if error is None:
                images[index] = array
            else:
                invalid[index] = error
        images.flush()
    # The record goes last: only an array with a record is ever trusted.
    write_record(record_path, {"shape": list(shape)}, images, invalid, files=[str(path) for path in files])
    size_mb = array_path.stat().st_size / 1e6
    # The unreadable files are named, refused or skipped, by the caller.
    unreadable = f" ({len(invalid)} unreadable files not in it)" if invalid else ""
    print(
        f"cached {len(files) - len(invalid)} images of {name}{unreadable} in {array_path} ({size_mb:.1f} MB); "
        "later runs open it at once"
    )
    return np.load(array_path, mmap_mode="r"), invalid


def load_or_check(files: list[Path], mode: str, cache_dir: Path, workers: int, name: str) -> dict[int, str]:
    """The unreadable ``files`` ({index: reason}) for streaming: each decoded once, recorded like the cache."""
    record = cache_dir / f"{name}-{fingerprint(files, {'check': mode})}.check.json"
    keyed = cache_key() is not None  # else no record can be trusted, nor written for later
    if keyed and record.exists():
        try:
            return recorded_invalid(record, len(files), {}, None, "the list of unreadable files")
        except ValueError as damage:
            rank_zero_warn(f"the check record of {name} is damaged, so the files are checked again: {damage}")
    description = f"checking {name} ({len(files)} files)"
    invalid = {i: error for i, _, error in decode_all(files, (8, 8), mode, workers, description) if error}
    if keyed:
        write_record(record, {}, None, invalid)
    return invalid
