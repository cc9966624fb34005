"""A sample's file written around the page cache (``O_DIRECT``): the drain's bytes go from its own
memory to the disk without the kernel copying them first.

Why: a buffered ``write`` copies every byte into the page cache, and the pages must then be found,
charged, written back and reclaimed. Profiled on 2 cores (bench/drain_prepare_cpu.py), that kernel
work was the largest share of a drain worker's CPU time: 1.0-1.6 CPU-seconds per GB of samples,
more than the reading, the checks, the hash and the format's conversion together. Written with
``O_DIRECT`` from a page-aligned buffer the same bytes cost 0.05-0.1 (bench/HISTORY.md,
2026-12-06). The drain never reads a sample's file back, so the page cache holds nothing it needs.

`DirectSink` gathers what a format's payload writes (small headers, large tensor bytes, staged
pieces) into one aligned buffer of its thread's, hashes each byte once as it arrives, and writes
the buffer out in whole blocks. The last partial block is written after the descriptor has left
direct mode (``fcntl``), so the file is exactly the payload's bytes, no padding and no truncation.
A filesystem that refuses direct writes (``EINVAL``: some FUSE and network filesystems, tmpfs
before Linux 6.6) gets the same bytes buffered: the first refusal turns direct mode off for the
file and the write is repeated.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import threading
from pathlib import Path

from hsextract.durable import write_payload_durably

__all__ = ["BLOCK", "DirectSink", "write_payload_direct"]

BLOCK = 4096  # the alignment of every direct write: offset, length and memory (a 4 KiB-sector disk's too)
BUFFER = 4 << 20  # bytes gathered before a direct write: large enough for the disk, small enough for the cache
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_LOCAL = threading.local()  # each thread's aligned buffer, reused from file to file (no page faults per file)


def _thread_buffer() -> memoryview:
    view = getattr(_LOCAL, "view", None)
    if view is None:
        view = _LOCAL.view = memoryview(mmap.mmap(-1, BUFFER))  # anonymous maps are page-aligned
    return view


class DirectSink:
    """A payload's sink (hsextract.formats.base.Sink) for a descriptor opened with ``O_DIRECT``:
    hashes the bytes as they come, gathers them into an aligned buffer, writes whole blocks.
    `close` writes what is left; the caller fsyncs."""

    def __init__(self, fd: int, hasher: object):
        self.fd = fd
        self.hasher = hasher
        self.nbytes = 0  # bytes accepted (hashed)
        self._buf = _thread_buffer()
        self._fill = 0  # bytes of the buffer not yet written
        self._direct = True

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        self.hasher.update(view)  # type: ignore[attr-defined]
        self._put(view)
        self.nbytes += len(view)
        return len(view)

    def copy_range(self, src) -> None:  # src: hsextract.formats.base.SourceRange
        """Hash and gather each piece of the staged bytes as it comes (it is still in the CPU cache)."""
        done = 0
        for piece in src.pieces:
            view = memoryview(piece).cast("B")
            self.hasher.update(view)  # type: ignore[attr-defined]
            self._put(view)
            done += len(view)
        if done != src.length:
            raise OSError(errno.EIO, f"the staged bytes ended after {done} of {src.length} bytes")
        self.nbytes += done

    def flush(self) -> None:
        """Nothing: only whole blocks can be written until `close` (``torch.save`` flushes at its end)."""

    def close(self) -> None:
        """Write the buffered rest, the last partial block through the page cache."""
        whole = self._fill - self._fill % BLOCK
        if whole:
            self._write(self._buf[:whole])
        if self._fill > whole:
            self._leave_direct_mode()
            self._write(self._buf[whole : self._fill])
        self._fill = 0

    def _put(self, view: memoryview) -> None:
        buf, cap = self._buf, len(self._buf)
        while view:
            n = min(len(view), cap - self._fill)
            buf[self._fill : self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
            if self._fill == cap:
                self._write(buf)
                self._fill = 0

    def _write(self, view: memoryview) -> None:
        while view:
            try:
                n = os.write(self.fd, view)
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self._direct:
                    raise
                self._leave_direct_mode()  # the filesystem takes no direct writes: the same bytes, buffered
                continue
            if n % BLOCK and self._direct and n < len(view):
                self._leave_direct_mode()  # a short write off a block's edge: the rest cannot stay aligned
            view = view[n:]

    def _leave_direct_mode(self) -> None:
        if self._direct:
            flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags & ~_O_DIRECT)
            self._direct = False


def write_payload_direct(path: str | Path, payload: object, hasher: object) -> int:
    """`hsextract.durable.write_payload_durably` (create, stream while hashing, fsync; the partial file
    removed on failure), written around the page cache where the filesystem allows it. Returns bytes."""
    if not _O_DIRECT:
        return write_payload_durably(path, payload, hasher)
    p = Path(path)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_DIRECT, 0o644)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return write_payload_durably(path, payload, hasher)  # no direct mode on this filesystem
    try:
        sink = DirectSink(fd, hasher)
        payload.write_to(sink)  # type: ignore[attr-defined]
        sink.close()
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
        raise
    os.close(fd)
    return sink.nbytes
