"""Files written whole or not at all (a temporary beside the target, created anew, renamed over it), and files from
elsewhere read only as what they say they are: regular files, never more than a reader asked for."""

import os
import sqlite3
import stat
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from template.text import shown

SPARSE_FROM = 64 << 20  # a file this large may be mostly holes (check_dense); below it, reading it all is cheap


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


def walk(folder: Path, max_depth: int, hidden: bool = True) -> Iterator[Path]:
    """Every folder and file below ``folder``, top-down, links listed but not followed; hidden folders listed but,
    unless ``hidden``, not entered. A ValueError naming it where folders nest past ``max_depth``: Path.rglob recursed a
    stack frame a level, and 1,000 levels ended in a RecursionError that named no folder."""
    for parent, folders, files in os.walk(folder):
        if len(Path(parent).relative_to(folder).parts) > max_depth:
            raise ValueError(f"{shown(folder, markup=False)} nests folders over {max_depth} deep")
        yield from (Path(parent, name) for name in folders + files)
        if not hidden:
            folders[:] = [name for name in folders if not name.startswith(".")]


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
    """A path to read that is a folder, a FIFO, a socket, a device or a file mostly of holes."""


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened to read if a regular file (links followed), else NotARegularFile says what it is (a FIFO would
    wait for a writer, a tty acts on being opened, a file of holes costs its size to read); checked again once open:
    another file may take its name."""
    check_regular(path, os.stat(path).st_mode)
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        check_regular(path, (status := os.fstat(descriptor)).st_mode)
        check_dense(path, descriptor, status)
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def check_regular(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        what = "a directory" if stat.S_ISDIR(mode) else "no regular file (a FIFO, socket or device)"
        raise NotARegularFile(f"{path} is {what}")


def check_dense(path: Path, descriptor: int, status: os.stat_result) -> None:
    """Refuse a file mostly of holes (sparse: ``truncate``, ``tar -S``, ``rsync -S`` make them): reading one costs
    its size, gigabytes, for the kilobytes someone sent. Past ``SPARSE_FROM`` bytes, with its disk blocks under an
    eighth of them and a hole the filesystem reports (one that reports none is taken at its word)."""
    if status.st_size > SPARSE_FROM and status.st_blocks * 512 * 8 < status.st_size:
        try:
            hole = os.lseek(descriptor, 0, os.SEEK_HOLE)
        except OSError:
            return
        finally:
            os.lseek(descriptor, 0, os.SEEK_SET)
        if hole < status.st_size:
            raise NotARegularFile(
                f"{path} is a file of holes (sparse): {status.st_size:,} bytes in {status.st_blocks * 512:,} of disk"
            )


def read_at_most(path: Path, limit: int) -> bytes:
    """The bytes of regular file ``path``; ValueError if there are over ``limit`` of them (only those are read)."""
    with open_regular(path) as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit:,} bytes")
    return data


def schema_of(database: sqlite3.Connection) -> list[tuple]:
    """A SQLite database's schema entries (kind, name, table, SQL), whitespace aside: SQLAlchemy versions lay out the
    same DDL differently."""
    rows = database.execute("SELECT type, name, tbl_name, sql FROM sqlite_master")
    return [(kind, name, table, sql and " ".join(sql.split())) for kind, name, table, sql in rows]


def foreign_sql(entries: Iterable[tuple], known: Collection[tuple]) -> str | None:
    """The first of a database's schema ``entries`` (``schema_of``'s) that is not ``known``, described; None: none."""
    if unknown := sorted(entry for entry in entries if entry not in known):
        kind, name, _, sql = unknown[0]
        return f"{kind} {name!r} ({sql!s:.80})"
    return None
