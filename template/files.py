"""Files written whole or not at all (a temporary beside the target, created anew, renamed over it), and files from
elsewhere read only as what they say they are: regular files, never more than a reader asked for."""

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def replaced_atomically(path: Path) -> Iterator[Path]:
    """A temporary path to write, renamed to ``path`` when the block ends without an error: a link planted at
    ``path`` or at the temporary's name is replaced, never written through; an error leaves ``path`` as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent, f".{path.name}.*.tmp")  # this file's own: a folder may be anyone's
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # same folder: the rename is atomic
    try:
        temporary.unlink(missing_ok=True)
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))
        yield temporary
        with open(temporary, "rb+") as file:
            os.fsync(file.fileno())  # on disk before the rename, which is what makes it trusted
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself durable
    finally:
        os.close(directory)


def write_atomic(path: Path, text: str) -> None:
    with replaced_atomically(path) as temporary:
        temporary.write_text(text)


def remove_stale_temporaries(directory: Path, pattern: str) -> None:
    """Remove the temporary files (``.<name>.<pid>.tmp``, matching ``pattern``) of writers no longer running."""
    for stale in directory.glob(pattern):
        pid = stale.name.rsplit(".", 2)[-2]
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)  # signal 0 only asks whether the process exists
            except ProcessLookupError:
                stale.unlink(missing_ok=True)
            except PermissionError:  # another user's process, alive
                pass


class NotARegularFile(OSError):
    """A path to read that is a folder, a FIFO, a socket or a device."""


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened to read if a regular file (links followed), else NotARegularFile says what it is (a FIFO would
    wait for a writer, a tty acts on being opened); checked again once open: another file may take its name."""
    check_regular(path, os.stat(path).st_mode)
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        check_regular(path, os.fstat(descriptor).st_mode)
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def check_regular(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        what = "a directory" if stat.S_ISDIR(mode) else "no regular file (a FIFO, socket or device)"
        raise NotARegularFile(f"{path} is {what}")


def read_at_most(path: Path, limit: int) -> bytes:
    """The bytes of regular file ``path``; ValueError if there are over ``limit`` of them (only those are read)."""
    with open_regular(path) as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit:,} bytes")
    return data
