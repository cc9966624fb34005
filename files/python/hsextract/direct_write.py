"""A sample's file written around the page cache (``O_DIRECT``): the drain's bytes go from its own
memory to the disk without the kernel copying them first.

Why: a buffered ``write`` copies every byte into the page cache, and the pages must then be found,
charged, written back and reclaimed. Profiled on 2 cores (bench/drain_prepare_cpu.py), that kernel
work was the largest share of a drain worker's CPU time: 1.0-1.6 CPU-seconds per GB of samples,
more than the reading, the checks, the hash and the format's conversion together. Written with
``O_DIRECT`` from a page-aligned buffer the same bytes cost 0.05-0.1 (bench/HISTORY.md,
2026-12-06). The drain never reads a sample's file back, so the page cache holds nothing it needs.

`DirectSink` gathers what a format's payload writes (small headers, large tensor bytes, staged
pieces) into aligned buffers, hashes each byte once as it arrives, and writes each full buffer at
its offset from a small pool of writer threads (``pwrite``; the GIL is released while the disk
works), up to `DEPTH` buffers of a file at once: a direct write returns only once the disk has the
bytes, and without the overlap a worker would wait on the disk instead of checking the next rows.
The last partial block is written after the descriptor has left direct mode (``fcntl``), so the
file is exactly the payload's bytes, no padding and no truncation.
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
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from hsextract.durable import copy_pieces, write_payload_durably

__all__ = ["BLOCK", "BUFFER", "DEPTH", "DirectSink", "write_payload_direct"]

BLOCK = 4096  # the alignment of every direct write: offset, length and memory (a 4 KiB-sector disk's too)
BUFFER = 4 << 20  # bytes gathered per direct write: large enough for the disk, small enough for the cache
DEPTH = 3  # a file's buffers being written at once, while the next one fills
_WRITERS = 4  # the process's writer threads (shared by its workers' files)
_O_DIRECT = getattr(os, "O_DIRECT", 0)

_LOCK = threading.Lock()
_FREE: list[memoryview] = []  # the process's aligned buffers not in use (reused: no page faults per file)
_POOL: tuple[int, ThreadPoolExecutor] | None = None  # (the pid it was made in, the writer threads)


def _take_buffer() -> memoryview:
    with _LOCK:
        if _FREE:
            return _FREE.pop()
    return memoryview(mmap.mmap(-1, BUFFER))  # anonymous maps are page-aligned


def _give_back(buf: memoryview) -> None:
    with _LOCK:
        _FREE.append(buf)


def _writers() -> ThreadPoolExecutor:
    global _POOL
    with _LOCK:
        if _POOL is None or _POOL[0] != os.getpid():  # a forked child gets threads of its own
            _POOL = (os.getpid(), ThreadPoolExecutor(_WRITERS, thread_name_prefix="hsextract-direct-write"))
        return _POOL[1]


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


class DirectSink:
    """A payload's sink (hsextract.formats.base.Sink) for a descriptor opened with ``O_DIRECT``:
    hashes the bytes as they come, gathers them into aligned buffers, writes each full one from the
    writer threads. `close` writes what is left and waits for every write; `abort` only waits. The
    caller fsyncs."""

    def __init__(self, fd: int, hasher: object):
        self.fd = fd
        self.hasher = hasher
        self.nbytes = 0  # bytes accepted (hashed)
        self._buf = _take_buffer()
        self._fill = 0  # bytes of the current buffer
        self._offset = 0  # the file offset of the current buffer's first byte
        self._inflight: deque[tuple[Future, memoryview, int]] = deque()
        self._direct = True

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        self.hasher.update(view)  # type: ignore[attr-defined]
        self._put(view)
        self.nbytes += len(view)
        return len(view)

    def copy_range(self, src) -> None:  # src: hsextract.formats.base.SourceRange
        """Hash and gather each piece of the staged bytes as it comes (it is still in the CPU cache)."""
        self.nbytes += copy_pieces(src, self.hasher, self._put)

    def flush(self) -> None:
        """Nothing: only whole blocks can be written until `close` (``torch.save`` flushes at its end)."""

    def close(self) -> None:
        """Write the rest (its last partial block through the page cache) and wait for every write."""
        whole = self._fill - self._fill % BLOCK
        while self._inflight:
            self._retire()
        if whole:
            self._write_now(self._buf[:whole], self._offset)
        if self._fill > whole:
            self._leave_direct_mode()
            _pwrite_all(self.fd, self._buf[whole : self._fill], self._offset + whole)
        self._release()

    def abort(self) -> None:
        """Wait for the writes in flight (their errors do not matter now) and give the buffers back."""
        while self._inflight:
            future, buf, _ = self._inflight.popleft()
            with contextlib.suppress(Exception):
                future.result()
            _give_back(buf)
        self._release()

    def _put(self, view: memoryview) -> None:
        while view:
            cap = len(self._buf)
            n = min(len(view), cap - self._fill)
            self._buf[self._fill : self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
            if self._fill == cap:
                self._submit()

    def _submit(self) -> None:
        """The full current buffer to the writer threads; a fresh one to fill (the oldest write waited
        for when `DEPTH` are in flight)."""
        self._inflight.append(
            (_writers().submit(_pwrite_all, self.fd, self._buf, self._offset), self._buf, self._offset)
        )
        self._offset += self._fill
        self._buf, self._fill = _take_buffer(), 0
        if len(self._inflight) >= DEPTH:
            self._retire()

    def _retire(self) -> None:
        future, buf, offset = self._inflight.popleft()
        try:
            future.result()
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._leave_direct_mode()  # the filesystem takes no direct writes: the same bytes, buffered
            _pwrite_all(self.fd, buf, offset)
        _give_back(buf)

    def _write_now(self, view: memoryview, offset: int) -> None:
        try:
            _pwrite_all(self.fd, view, offset)
        except OSError as exc:
            if exc.errno != errno.EINVAL or not self._direct:
                raise
            self._leave_direct_mode()
            _pwrite_all(self.fd, view, offset)

    def _release(self) -> None:
        if self._buf is not None:
            _give_back(self._buf)
            self._buf = None  # type: ignore[assignment]

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
    sink = None
    try:
        sink = DirectSink(fd, hasher)
        payload.write_to(sink)  # type: ignore[attr-defined]
        sink.close()
        os.fsync(fd)
    except BaseException:
        if sink is not None:
            sink.abort()  # no write may land after the file is closed and removed
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
        raise
    os.close(fd)
    return sink.nbytes
