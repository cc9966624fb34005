"""Durable file operations: what "written" means for the training set.

A sample counts as written only when its bytes and its directory entry have reached the disk:
write under a temporary name, fsync the file, rename it into place, fsync the directory. A crash
at any instant then leaves either the whole file under its final name or no file there at all.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterable
from pathlib import Path


def fsync_dir(path: str | Path) -> None:
    """Make the directory's entries (creations, renames, removals) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, chunks: Iterable[bytes | memoryview]) -> int:
    """Write every chunk to `fd` (looping over short writes); return the byte count."""
    total = 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        while view:
            n = os.write(fd, view)
            view = view[n:]
            total += n
    return total


def write_file_durably(path: str | Path, chunks: Iterable[bytes | memoryview]) -> int:
    """Create `path` (truncating), write the chunks, fsync; remove the partial file on failure."""
    p = Path(path)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        n = write_all(fd, chunks)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
        raise
    os.close(fd)
    return n


def atomic_write_bytes(path: str | Path, data: bytes, *, durable: bool = True) -> None:
    """Replace `path` with `data` atomically (temporary name beside it, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    if durable:
        write_file_durably(tmp, [data])
    else:
        tmp.write_bytes(data)
    os.replace(tmp, p)
    if durable:
        fsync_dir(p.parent)


def free_bytes(path: str | Path) -> int:
    """Free bytes available to this user on the filesystem holding `path` (its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def is_no_space(exc: BaseException) -> bool:
    """True for "the volume is full" errors (ENOSPC, and EDQUOT for quotas)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
