"""The local side of a download from a bucket: a file created anew, never through a link, and
an error of its writes that names it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hsextract.durable import write_all

T = TypeVar("T")


def new_file(path: Path) -> int:
    """A write descriptor on `path`, created anew (mode 0644): what stood there is removed first,
    and a link put in its place meanwhile is refused (ELOOP), never written through."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)


def stream_into(body: Any, dest: Path, algorithm: str, chunk: int) -> tuple[int, str]:
    """A response body into `dest` (`new_file`), hashed on the way; (byte count, "<algorithm>:<hex>" or "")."""
    from hsextract.output.manifest import new_hasher

    n = 0
    h = new_hasher(algorithm) if algorithm else None
    fd = _named(dest, new_file, dest)
    try:
        for piece in body.iter_chunks(chunk):
            _named(dest, write_all, fd, [piece])
            if h is not None:
                h.update(piece)
            n += len(piece)
    finally:
        os.close(fd)
    return n, f"{algorithm}:{h.hexdigest()}" if h is not None else ""


def _named(path: Path, call: Callable[..., T], *args: Any) -> T:
    """`call(*args)`, a file operation on `path`: an OSError it raises (a full volume) names `path`."""
    try:
        return call(*args)
    except OSError as exc:
        if exc.filename:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
