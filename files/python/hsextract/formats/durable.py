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
import threading
from collections.abc import Iterable, Iterator
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


@contextlib.contextmanager
def _new_durable_file(path: str | Path) -> Iterator[int]:
    """An fd on `path` (created or truncated), fsynced when the block ends; on any failure the
    partial file is removed, so a half-written sample never stands under any name."""
    p = Path(path)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        yield fd
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
        raise
    os.close(fd)


def write_file_durably(path: str | Path, chunks: Iterable[bytes | memoryview]) -> int:
    """Create `path` (truncating), write the chunks, fsync; remove the partial file on failure."""
    with _new_durable_file(path) as fd:
        n = write_all(fd, chunks)
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


class HashingFileSink:
    """Writes a payload to an open file descriptor and hashes exactly the bytes written.

    Small writes (``torch.save`` emits many record headers) are gathered into one buffer; large
    ones go straight to the file; staged ranges are sent by the kernel (``sendfile``, as ``cp``
    does) while the hash reads the same bytes from their mapping.
    """

    _DIRECT = 256 << 10
    _BUFFER = 1 << 20

    def __init__(self, fd: int, hasher: object):
        self.fd = fd
        self.hasher = hasher
        self.nbytes = 0
        self._buf = bytearray()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        self.hasher.update(view)  # type: ignore[attr-defined]
        if n >= self._DIRECT:
            self.flush()
            write_all(self.fd, [view])
        else:
            self._buf += view
            if len(self._buf) >= self._BUFFER:
                self.flush()
        self.nbytes += n
        return n

    def copy_range(self, src) -> None:  # src: hsextract.formats.base.SourceRange
        self.flush()
        if src.view is None:
            self._stream_range(src)
            return
        self.hasher.update(src.view)  # type: ignore[attr-defined]
        offset, left = src.offset, src.length
        while left:
            try:
                sent = os.sendfile(self.fd, src.fd, offset, left)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                write_all(self.fd, [src.view[src.length - left :]])
                break
            if sent == 0:
                raise OSError(errno.EIO, f"staged file ended {left} bytes early while copying")
            offset += sent
            left -= sent
        self.nbytes += src.length

    def _stream_range(self, src) -> None:
        """pread into a per-thread reused buffer, check, hash, write: one pass, no new pages."""
        buf = _stream_buffer()
        done = 0
        while done < src.length:
            n = min(len(buf), src.length - done)
            got = 0
            while got < n:  # fill the piece completely, so checks see whole elements
                r = os.preadv(src.fd, [buf[got:n]], src.offset + done + got)
                if r == 0:
                    raise OSError(errno.EIO, f"staged file ended {src.length - done - got} bytes early while copying")
                got += r
            piece = buf[:n]
            if src.check is not None and done < src.check_len:
                src.check(piece[: src.check_len - done], done)
            self.hasher.update(piece)  # type: ignore[attr-defined]
            write_all(self.fd, [piece])
            done += n
        self.nbytes += src.length

    def flush(self) -> None:
        if self._buf:
            write_all(self.fd, [self._buf])
            self._buf = bytearray()


_local = threading.local()
STREAM_CHUNK = 1 << 20  # a multiple of every element size


def _stream_buffer() -> memoryview:
    buf = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = memoryview(bytearray(STREAM_CHUNK))
    return buf


def write_payload_durably(path: str | Path, payload: object, hasher: object) -> int:
    """Create `path`, stream the payload into it while hashing, fsync; remove it on failure. Returns bytes."""
    with _new_durable_file(path) as fd:
        sink = HashingFileSink(fd, hasher)
        payload.write_to(sink)  # type: ignore[attr-defined]
        sink.flush()
    return sink.nbytes
