"""Moves captured rows from the forward pass to /dev/shm without making the forward pass wait.

Inside the forward (``CaptureWriter.submit``) the batch's aux and final hidden states are
concatenated on the device into one contiguous ``[T, K + 1, H]`` block (one kernel), and an
asynchronous device-to-host copy into a reusable pinned host buffer is queued on a side CUDA
stream, followed by an event. That is all the forward pays for. A dispatcher thread waits for
the event, asks the `CapturePlanner` where the rows go, and hands slices of them to a pool of
writer threads that copy straight from the pinned buffer into each request's
``states.safetensors``. A long request is split across threads and written through a shared
mapping of its file, because tmpfs serialises pwrite(2) on one file (~2.4 GB/s for any number
of threads on the H200 host) while mapped copies run in parallel (~4.9 GB/s with 8 threads).
Small segments, and any write while /dev/shm is nearly full, use pwrite: a page fault on a full
tmpfs would be a fatal SIGBUS, whereas pwrite reports ENOSPC. When every planned row of a complete request is on
disk, its ``done.json`` is written atomically.

Host memory is bounded: buffers come from a `HostBufferPool` with a byte budget. When the
writers fall behind and the budget is spent, ``submit`` blocks (and says so in the log) rather
than let memory grow. On a CPU-only server the same path runs with plain host buffers and a
synchronous copy.

A request that cannot be staged (a write error such as a full /dev/shm, a batch that could not
be queued, rows the capture never saw) is logged with the path and the reason, its partial file
is removed to give the space back, it is never marked done, and ``failed.json`` tells the client
why, so the client sends the sample again. Nothing here raises into the server.

All of this runs in SGLang's scheduler process, whose GIL the writer threads share with the
scheduler thread. With ``writer_process`` on, `hsextract.capture.writer_process` keeps only the
forward pass's part (`HostStager`) in that process and runs this writer, fed with batches that
have already landed (`CaptureWriter.submit_landed`), in a child process.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from hsextract.capture.core import BatchRequest, CapturePlanner, CaptureSettings, Failure, RequestState, Segment
from hsextract.staging import (
    CAPTURE_QUEUE_ERROR,
    CAPTURE_WRITE_ERROR,
    DONE_FILE,
    DTYPES,
    FAILED_FILE,
    STATES_FILE,
    FailureMarker,
    StateFileLayout,
    rid_dir,
    write_done_marker,
    write_failed_marker,
)

log = logging.getLogger("hsextract.capture")

_ALIGN = 64
_MiB = 1 << 20


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class HostBufferPool:
    """Reusable host buffers (pinned when CUDA is used) under a byte budget.

    Pinned allocations are slow (cudaHostAlloc pins every page: tens of milliseconds for a
    batch of short prompts at 8B width, inside the forward pass), so buffers are kept and reused.
    Their sizes are powers of two times the granularity: batches of many sizes (short prompts
    batched 1 to 50 at a time) then share a few size classes and reuse each other's buffers,
    instead of each new size costing a new pinned allocation. The budget bounds the bytes held
    by the pool, in use or free; a request larger than the whole budget is still served when
    nothing else is in use, so an oversized batch cannot deadlock the capture.

    ``allocate(nbytes)`` makes a new buffer (default: ``torch.empty``, pinned when ``pin``) and
    ``drop(buf)`` is told of each buffer the pool lets go of, so that buffers of another kind
    (memory shared with the writer process) can be given back where they came from.
    """

    def __init__(self, max_bytes: int, pin: bool, granularity: int = 2 * _MiB,
                 allocate: Callable[[int], torch.Tensor] | None = None,
                 drop: Callable[[torch.Tensor], None] | None = None):
        self.max_bytes = int(max_bytes)
        self.pin = pin
        self.granularity = max(1, int(granularity))
        self._allocate = allocate or (lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=self.pin))
        self._drop = drop
        self._cond = threading.Condition()
        self._free: list[torch.Tensor] = []
        self._in_use = 0
        self._held = 0  # bytes allocated (in use + free)
        self.blocked_seconds = 0.0
        self.blocked_count = 0
        self._last_block_log = 0.0
        self.allocations = 0
        self.allocation_seconds = 0.0

    @property
    def in_use(self) -> int:
        return self._in_use

    def acquire(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of at least ``nbytes``; blocks while the budget is spent."""
        t0 = None
        with self._cond:
            while True:
                buf = self._take(nbytes)
                if buf is not None:
                    break
                if t0 is None:
                    t0 = time.monotonic()
                    self.blocked_count += 1
                    if t0 - self._last_block_log > 10:
                        self._last_block_log = t0
                        log.warning(
                            "capture blocked: %d MiB of host buffers in flight reached the limit of %d MiB; "
                            "the forward pass waits for the writers (raise the in-flight limit or add writer "
                            "threads if this repeats)", self._in_use // _MiB, self.max_bytes // _MiB)
                self._cond.wait(timeout=1.0)
        if t0 is not None:
            self.blocked_seconds += time.monotonic() - t0
        return buf

    def try_acquire(self, nbytes: int) -> torch.Tensor | None:
        """`acquire` without waiting: None where it would block."""
        with self._cond:
            return self._take(nbytes)

    def _take(self, nbytes: int) -> torch.Tensor | None:
        """The smallest free buffer that fits, else a new one within the budget, else None (under the lock).

        Free buffers are found by index, never by value: ``list.remove`` would compare tensors
        with ``==`` (element-wise), which raises once the pool holds buffers of different sizes.
        """
        best = None
        for i, b in enumerate(self._free):
            if b.numel() >= nbytes and (best is None or b.numel() < self._free[best].numel()):
                best = i
        if best is not None:
            buf = self._free.pop(best)
            self._in_use += buf.numel()
            return buf
        need = self.size_class(nbytes)
        while self._free and self._held + need > self.max_bytes:
            largest = max(range(len(self._free)), key=lambda i: self._free[i].numel())
            self._let_go(self._free.pop(largest))
        if self._held + need > self.max_bytes and self._in_use != 0:
            return None
        # Within the budget, or an oversized request while nothing else is in use (it goes alone,
        # so an oversized batch cannot deadlock the capture).
        t0 = time.monotonic()
        buf = self._allocate(need)
        took = time.monotonic() - t0
        self.allocations += 1
        self.allocation_seconds += took
        self._held += need
        self._in_use += need
        if took > 0.01:
            log.info("capture: a new %d MiB host buffer took %.0f ms (pool: %d MiB in %d buffers, %d allocations)",
                     need // _MiB, took * 1000, self._held // _MiB, len(self._free) + 1, self.allocations)
        return buf

    def size_class(self, nbytes: int) -> int:
        """The size of a new buffer for ``nbytes``: the granularity times a power of two."""
        units = -(-max(int(nbytes), 1) // self.granularity)
        return self.granularity * (1 << (units - 1).bit_length())

    @property
    def held(self) -> int:
        """Bytes the pool holds, in use or free."""
        return self._held

    @property
    def free_sizes(self) -> list[int]:
        with self._cond:
            return [b.numel() for b in self._free]

    def release(self, buf: torch.Tensor) -> None:
        with self._cond:
            self._in_use -= buf.numel()
            self._free.append(buf)
            self._cond.notify_all()

    def clear(self) -> None:
        """Let go of every free buffer (buffers in use stay the caller's)."""
        with self._cond:
            while self._free:
                self._let_go(self._free.pop())

    def _let_go(self, buf: torch.Tensor) -> None:
        """A free buffer leaves the pool (under the lock)."""
        self._held -= buf.numel()
        if self._drop is not None:
            try:
                self._drop(buf)
            except Exception:  # a failed unmap must not fail the forward pass
                log.exception("capture: letting go of a %d MiB host buffer failed", buf.numel() // _MiB)


@dataclass
class _FailJob:
    """Requests the forward pass could not hand over: the dispatcher marks them failed, in order
    with the batches before and after them (so a later chunk of one finds it failed)."""

    failures: list[Failure]


@dataclass
class _Job:
    """One batch in flight: the host copy, the event that says it landed, and what it holds."""

    requests: list[BatchRequest]
    buf: torch.Tensor
    event: object | None
    rows: int
    row_bytes: int
    ids_offset: int  # byte offset of the int64 input ids in buf
    lens_offset: int  # byte offset of the int64 prompt lengths in buf
    batch_size: int
    remaining: int = 0
    lock: threading.Lock | None = None
    # Called once the batch is written, in place of giving ``buf`` back to the writer's pool (a
    # batch handed over already landed, in a buffer that belongs to someone else).
    on_finish: Callable[[_Job], None] | None = None


class _MappedFile:
    """A shared mapping of one request's file that several writer threads fill at once.

    tmpfs serialises pwrite(2) on one file under its inode lock (~2.4 GB/s whatever the thread
    count, measured on the H200 host), while copies into a shared mapping fault pages in
    parallel (~4.9 GB/s with 8 threads). The mapping is closed when its last slice is written.
    """

    def __init__(self, path: Path, size: int, users: int, reserved: int, unreserve):
        fd = os.open(path, os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._anchor = ctypes.c_char.from_buffer(self._mm)
        self.addr = ctypes.addressof(self._anchor)
        self._users = users
        self._reserved = reserved
        self._unreserve = unreserve
        self._lock = threading.Lock()

    def done(self, nbytes: int) -> None:
        with self._lock:
            self._users -= 1
            self._reserved -= nbytes
            last = self._users == 0
        self._unreserve(nbytes)
        if last:
            if self._reserved:
                self._unreserve(self._reserved)
            del self._anchor
            self._mm.close()


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, offset)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        data = data[n:]
        offset += n


class HostStager:
    """The forward pass's part of the capture: one batch's rows into a host buffer, nothing more.

    Shared by the in-process writer and the writer process's parent side, so that the forward
    pass pays the same in both modes.
    """

    def __init__(self, settings: CaptureSettings, device: torch.device, pool: HostBufferPool):
        self.settings = settings
        self.device = device
        self.cuda = device.type == "cuda"
        self.pool = pool
        self._side_stream = torch.cuda.Stream(device=device) if self.cuda else None

    def stage(
        self,
        requests: list[BatchRequest],
        aux: torch.Tensor | list[torch.Tensor],
        final: torch.Tensor,
        input_ids: torch.Tensor,
        prompt_lens: torch.Tensor | list[int],
    ) -> _Job | None:
        """Concatenate the batch on the device and queue its copy into a pool buffer; the job, or
        None for a batch without requests."""
        if not requests:
            return None
        s = self.settings
        k, h = s.num_aux, s.hidden_size
        rows = max(r.batch_row + r.extend_len for r in requests)
        dtype = DTYPES[s.dtype][0]
        with torch.no_grad():
            if torch.is_tensor(aux):
                if aux.shape[-1] != k * h:
                    raise ValueError(f"aux hidden states have width {aux.shape[-1]}, expected {k} x {h}")
                parts = [aux[:rows].reshape(rows, k, h), final[:rows].reshape(rows, 1, h)]
                block = torch.cat(parts, dim=1)
            else:
                if len(aux) != k:
                    raise ValueError(f"got {len(aux)} aux hidden states, expected {k}")
                block = torch.stack([a[:rows] for a in aux] + [final[:rows]], dim=1)
            if block.dtype != dtype:
                block = block.to(dtype)
            ids = input_ids[:rows].to(torch.int64)
            if not torch.is_tensor(prompt_lens):
                prompt_lens = torch.tensor(list(prompt_lens), dtype=torch.int64)
            lens = prompt_lens.to(torch.int64)
            bsz = int(lens.numel())
            row_bytes = (k + 1) * h * DTYPES[s.dtype][2]
            ids_off = _round_up(rows * row_bytes, _ALIGN)
            lens_off = _round_up(ids_off + 8 * rows, _ALIGN)
            total = lens_off + 8 * bsz
            buf = self.pool.acquire(total)
            try:
                event = self._copy_to_host(buf, block, ids, lens, rows, row_bytes, ids_off, lens_off, bsz)
            except BaseException:
                self.pool.release(buf)
                raise
        return _Job(list(requests), buf, event, rows, row_bytes, ids_off, lens_off, bsz, lock=threading.Lock())

    def _copy_to_host(self, buf: torch.Tensor, block: torch.Tensor, ids: torch.Tensor, lens: torch.Tensor,
                      rows: int, row_bytes: int, ids_off: int, lens_off: int, bsz: int) -> object | None:
        """Copy the batch into ``buf`` (asynchronously on the side stream on CUDA); the event that
        says it landed, or None when the copy was synchronous."""
        dtype = block.dtype
        host_block = buf[: rows * row_bytes].view(dtype).view(rows, block.shape[1], block.shape[2])
        host_ids = buf[ids_off : ids_off + 8 * rows].view(torch.int64)
        host_lens = buf[lens_off : lens_off + 8 * bsz].view(torch.int64)
        if not self.cuda:
            host_block.copy_(block)
            host_ids.copy_(ids)
            host_lens.copy_(lens)
            return None
        stream = self._side_stream
        assert stream is not None  # made with the writer on CUDA
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            host_block.copy_(block, non_blocking=True)
            host_ids.copy_(ids, non_blocking=True)
            host_lens.copy_(lens, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        for t in (block, ids, lens):
            if t.device.type == "cuda":
                t.record_stream(stream)
        return event


class _BatchQueue:
    """What both writers do on the forward pass's side: stage a batch, count it outstanding and
    queue it, or queue its requests' failures, for a dispatcher thread that takes the items one at
    a time (`_dispatch_one`). ``_cond`` guards ``_outstanding``."""

    _stager: HostStager
    _jobs: queue.Queue
    _cond: threading.Condition
    _outstanding: int

    def submit(
        self,
        requests: list[BatchRequest],
        aux: torch.Tensor | list[torch.Tensor],
        final: torch.Tensor,
        input_ids: torch.Tensor,
        prompt_lens: torch.Tensor | list[int],
    ) -> None:
        """Queue one batch's rows (``aux`` packed ``[T, K*H]`` or K tensors ``[T, H]``)."""
        job = self._stager.stage(requests, aux, final, input_ids, prompt_lens)
        if job is not None:
            self._enqueue(job)

    def fail_requests(self, requests: list[BatchRequest], reason: str, detail: str) -> None:
        """Mark requests of a batch the forward pass could not hand over as failed (from the forward
        thread: queued behind the batches already submitted, never blocking)."""
        if requests:
            self._enqueue(_FailJob([Failure(r.rid, reason, detail) for r in requests]))

    def _enqueue(self, item: _Job | _FailJob) -> None:
        with self._cond:
            self._outstanding += 1
        self._jobs.put(item)

    def _dispatch_loop(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            self._dispatch_one(item)
            del item  # not held while waiting for the next: its buffer may be unmapped once released

    def _dispatch_one(self, item) -> None:
        raise NotImplementedError


class CaptureWriter(_BatchQueue):
    """Stages captured batches as per-request files; see the module docstring."""

    def __init__(
        self,
        dump_dir: str | Path,
        settings: CaptureSettings,
        *,
        device: str | torch.device = "cpu",
        num_threads: int = 8,
        max_bytes_in_flight: int = 2 << 30,
        slice_bytes: int = 32 * _MiB,
        map_margin_bytes: int = 512 * _MiB,
        pool_granularity: int = 2 * _MiB,
    ):
        self.dump_dir = Path(dump_dir)
        self._root = os.fspath(self.dump_dir)  # string paths on the per-request path: pathlib costs
        # The planner asks whether a complete dump is still staged before it takes a resend for one.
        self.planner = CapturePlanner(settings, is_staged=self._complete_dump_staged)
        self.settings = settings
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.slice_bytes = max(int(slice_bytes), 1)
        self.map_margin_bytes = int(map_margin_bytes)
        self._space_lock = threading.Lock()
        self._reserved = 0
        self.pool = HostBufferPool(max_bytes_in_flight, pin=self.cuda, granularity=pool_granularity)
        self._stager = HostStager(settings, self.device, self.pool)
        self._jobs: queue.Queue[_Job | _FailJob | None] = queue.Queue()
        self.num_threads = max(1, num_threads)
        self._executor = ThreadPoolExecutor(max_workers=self.num_threads, thread_name_prefix="hsx-write")
        self._marker_shared: str | None = None
        self._outstanding = 0
        self._cond = threading.Condition()
        self.bytes_written = 0
        self.requests_done = 0
        self.requests_failed = 0
        self.write_errors = 0  # requests that a failed write lost (not writes: a request has many slices)
        self._stats_lock = threading.Lock()
        self._closed = False
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="hsx-dispatch", daemon=True)
        self._dispatcher.start()

    def _complete_dump_staged(self, rid: str) -> bool:
        return os.path.exists(f"{self._root}/{rid}/{DONE_FILE}")

    # ---- forward-pass side (submit, fail_requests: _BatchQueue) --------------------------------
    def submit_landed(self, requests: list[BatchRequest], buf: torch.Tensor, rows: int, row_bytes: int,
                      ids_offset: int, lens_offset: int, batch_size: int,
                      on_finish: Callable[[_Job], None]) -> None:
        """Queue a batch whose host copy has landed already, in a buffer that is not this writer's
        (the writer process's, or the parent's after that process died); ``on_finish(job)`` is
        called once it is written, in place of giving the buffer back to this writer's pool."""
        self._enqueue(_Job(list(requests), buf, None, rows, row_bytes, ids_offset, lens_offset, batch_size,
                           lock=threading.Lock(), on_finish=on_finish))

    def fail(self, failures: list[Failure]) -> None:
        """Queue requests to be marked failed, in order with the batches around them (never blocks)."""
        if failures:
            self._enqueue(_FailJob(list(failures)))

    # ---- writer side (the dispatcher thread: _BatchQueue._dispatch_loop) ----------------------
    def _dispatch_one(self, job: _Job | _FailJob) -> None:
        if isinstance(job, _FailJob):
            self._fail_requests_now(job.failures)
            self._job_done()
            return
        try:
            self._dispatch(job)
        except Exception as exc:  # never let a bug in the capture take the server down
            log.exception("capture: dispatching a batch of %d requests failed; they are marked failed for the "
                          "client to send again", len(job.requests))
            detail = f"dispatching the batch failed: {type(exc).__name__}: {exc}"
            self._fail_requests_now([Failure(r.rid, CAPTURE_QUEUE_ERROR, detail) for r in job.requests])
            self._finish_job(job)

    def _fail_requests_now(self, failures: list[Failure]) -> None:
        """Mark requests failed in the planner and leave ``failed.json`` for each (dispatcher thread)."""
        for f in failures:
            state = self.planner.fail(f.rid, f.reason)
            self._report_failure(state, f.reason, f.detail)

    def _dispatch(self, job: _Job) -> None:
        if job.event is not None:
            job.event.synchronize()  # type: ignore[attr-defined]  # a torch.cuda.Event
        lens = job.buf[job.lens_offset : job.lens_offset + 8 * job.batch_size].view(torch.int64).tolist()
        segments = self.planner.plan(job.requests, lens)
        for f in self.planner.take_failures():
            state = self.planner.get(f.rid)
            if state is None:  # dropped from tracking
                state = self.planner.fail(f.rid, f.reason)
            self._report_failure(state, f.reason, f.detail)
        mv = memoryview(job.buf.numpy())  # type: ignore[arg-type]  # a uint8 ndarray is a buffer
        per_slice_rows = max(1, self.slice_bytes // job.row_bytes)
        # The whole request in one slice (short prompts: most of them): a writer creates the file
        # and writes it in one call, off this thread.
        whole = [seg for seg in segments if self._whole(seg, per_slice_rows)]
        tasks = [task for seg in segments if not self._whole(seg, per_slice_rows)
                 for task in self._slices(seg, job.row_bytes, per_slice_rows)]
        groups = self._group_whole(whole, job.row_bytes)
        job.remaining = len(tasks) + len(groups)
        if not job.remaining:
            self._finish_job(job)
            return
        for group in groups:
            self._executor.submit(self._write_wholes, job, mv, group)
        for task in tasks:
            self._executor.submit(self._write_slice, job, mv, *task)

    def _slices(self, seg: Segment, row_bytes: int, per_slice_rows: int
                ) -> list[tuple[Segment, int, int, bool, _MappedFile | None]]:
        """A segment of a long (or chunked) request as row slices for several writers; its file is
        created first if this is its first chunk, and mapped where /dev/shm has room to spare."""
        if seg.create:
            self._prepare_file(seg.state)
        starts = list(range(0, seg.rows, per_slice_rows))
        mapped = None
        seg_bytes = seg.rows * row_bytes
        if len(starts) > 1 and not seg.state.failed and self._reserve(seg_bytes):
            mapped = self._map(seg.state, len(starts), seg_bytes)
        tasks = [(seg, a, min(a + per_slice_rows, seg.rows), a == 0, mapped) for a in starts]
        with seg.state.lock:
            seg.state.pending += len(tasks) - 1  # the planner counted the segment once
        return tasks

    def _group_whole(self, whole: list[Segment], row_bytes: int) -> list[list[Segment]]:
        """Whole requests split into a few groups, one writer task each.

        Each task costs the server's process a hand-over between threads under the GIL, which
        competes with SGLang's scheduler thread: 256 short prompts in flight are hundreds of
        requests a second. So a batch's whole requests go to as few tasks as keep the writers
        busy: at most one per writer thread, with at least 4 requests and 8 MiB each.
        """
        if not whole:
            return []
        nbytes = sum(seg.rows for seg in whole) * row_bytes
        n = max(1, min(self.num_threads, len(whole) // 4, nbytes // (8 * _MiB)))
        return [whole[i::n] for i in range(n)]

    @staticmethod
    def _whole(seg: Segment, per_slice_rows: int) -> bool:
        """Does this segment hold every row of a new request, in one slice?"""
        return seg.create and seg.dst_row == 0 and seg.rows == seg.state.prompt_len and seg.rows <= per_slice_rows

    def _reserve(self, nbytes: int) -> bool:
        """Room for ``nbytes`` written through a mapping? A page fault on a full tmpfs is a SIGBUS
        (fatal), not an error, so mapped writes are used only with free space to spare; otherwise
        pwrite, which reports ENOSPC as an error, is used."""
        try:
            st = os.statvfs(self.dump_dir)
        except OSError:
            return False
        free = st.f_bavail * st.f_frsize
        with self._space_lock:
            if free - self._reserved - nbytes < self.map_margin_bytes:
                return False
            self._reserved += nbytes
        return True

    def _unreserve(self, nbytes: int) -> None:
        with self._space_lock:
            self._reserved -= nbytes

    def _map(self, state: RequestState, users: int, reserved: int) -> _MappedFile | None:
        path = rid_dir(self.dump_dir, state.rid) / STATES_FILE
        try:
            return _MappedFile(path, state.layout.file_size, users, reserved, self._unreserve)
        except (OSError, ValueError) as exc:
            self._unreserve(reserved)
            log.warning("capture: cannot map %s (%s); writing it with pwrite", path, exc)
            return None

    def _prepare_file(self, state: RequestState) -> None:
        """(Re)create the request's file at full size with its header; drop a stale marker."""
        d = rid_dir(self.dump_dir, state.rid)
        path = d / STATES_FILE
        try:
            d.mkdir(parents=True, exist_ok=True)
            for stale in (DONE_FILE, FAILED_FILE):
                try:
                    (d / stale).unlink()
                    log.warning("rid %s: removed a stale %s left by an earlier send", state.rid, stale)
                except FileNotFoundError:
                    pass
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.ftruncate(fd, state.layout.file_size)
                _pwrite_all(fd, memoryview(state.layout.header), 0)
            finally:
                os.close(fd)
        except OSError as exc:
            self._fail(state, path, exc)

    def _write_wholes(self, job: _Job, mv: memoryview, group: list[Segment]) -> None:
        """Write a group of whole requests of the batch, one after the other (one task)."""
        for seg in group:
            self._write_one(job, mv, seg, 0, seg.rows, True, None)
        self._task_done(job)

    def _write_slice(self, job: _Job, mv: memoryview, seg: Segment, a: int, b: int, with_ids: bool,
                     mapped: _MappedFile | None) -> None:
        self._write_one(job, mv, seg, a, b, with_ids, mapped)
        self._task_done(job)

    def _write_one(self, job: _Job, mv: memoryview, seg: Segment, a: int, b: int, with_ids: bool,
                   mapped: _MappedFile | None) -> None:
        """Rows [a, b) of a segment into its file; a failure is reported, never raised."""
        state = seg.state
        path = self._states_path(state.rid)
        nbytes = (b - a) * job.row_bytes
        error = None if state.failed else self._put_slice(path, job, mv, seg, a, b, with_ids, mapped)
        if mapped is not None:
            mapped.done(nbytes)
        if error is not None:
            self._fail(state, path, error)
        self._slice_done(state)

    def _task_done(self, job: _Job) -> None:
        """One writer task of the batch is over; the last one gives the host buffer back."""
        assert job.lock is not None
        with job.lock:
            job.remaining -= 1
            last = job.remaining == 0
        if last:
            self._finish_job(job)

    def _put_slice(self, path: str, job: _Job, mv: memoryview, seg: Segment, a: int, b: int, with_ids: bool,
                   mapped: _MappedFile | None) -> OSError | None:
        """Write rows [a, b) of the segment (and its ids) into the request's file; the error, if any."""
        try:
            layout = seg.state.layout
            nbytes = (b - a) * job.row_bytes
            src = (seg.batch_row + a) * job.row_bytes
            dst = layout.hidden_offset(seg.dst_row + a)
            if with_ids and self._whole(seg, b):
                self._write_whole(path, layout, mv[src : src + nbytes], self._ids_view(job, mv, seg))
            elif mapped is not None:  # parallel: page faults do not take the inode lock
                ctypes.memmove(mapped.addr + dst, job.buf.data_ptr() + src, nbytes)
            if (mapped is None or with_ids) and not self._whole(seg, b):
                fd = os.open(path, os.O_WRONLY)
                try:
                    if mapped is None:  # pwrite: tmpfs serialises these per file
                        _pwrite_all(fd, mv[src : src + nbytes], dst)
                    if with_ids:
                        _pwrite_all(fd, self._ids_view(job, mv, seg), layout.ids_offset(seg.dst_row))
                finally:
                    os.close(fd)
            with self._stats_lock:
                self.bytes_written += nbytes + (8 * seg.rows if with_ids else 0)
        except OSError as exc:
            return exc
        except Exception as exc:  # a bug must not kill the writer thread silently
            log.exception("capture: unexpected error writing %s", path)
            return OSError(errno.EIO, str(exc))
        return None

    @staticmethod
    def _ids_view(job: _Job, mv: memoryview, seg: Segment) -> memoryview:
        start = job.ids_offset + 8 * seg.batch_row
        return mv[start : start + 8 * seg.rows]

    def _states_path(self, rid: str) -> str:
        return f"{self._root}/{rid}/{STATES_FILE}"

    def _write_whole(self, path: str, layout: StateFileLayout, rows: memoryview, ids: memoryview) -> None:
        """Create a request's file and write all of it (header, rows, ids: contiguous) in one call."""
        d = os.path.dirname(path)
        try:
            os.mkdir(d)
        except FileExistsError:
            for stale in (DONE_FILE, FAILED_FILE):  # of an earlier send of the same rid
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(d, stale))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            parts = [memoryview(layout.header), rows, ids]
            written = os.pwritev(fd, parts, 0)
            if written < layout.file_size:  # a short write: the rest, piece by piece
                flat = b"".join(parts)
                _pwrite_all(fd, memoryview(flat)[written:], written)
        finally:
            os.close(fd)

    def _fail(self, state: RequestState, path: str | Path, exc: OSError) -> None:
        """A write of the request failed: give up on it and tell the client why."""
        hint = " (/dev/shm is full: the client should pause, or the drain is not keeping up)" \
            if exc.errno == errno.ENOSPC else ""
        self._report_failure(state, CAPTURE_WRITE_ERROR, f"cannot write {path}: {exc.strerror or exc}{hint}")

    def _report_failure(self, state: RequestState, reason: str, detail: str) -> None:
        """Once per request: mark it failed, remove its partial rows, leave ``failed.json``."""
        with state.lock:
            first = not state.reported
            state.reported = True
            if not state.failed:
                state.failed = reason
        if not first:
            return  # its other slices failed too: one request, one error
        if reason == CAPTURE_WRITE_ERROR:
            with self._stats_lock:
                self.write_errors += 1
        log.error("capture: request %s cannot be staged (%s: %s); it is marked failed for the client to send again",
                  state.rid, reason, detail)
        with contextlib.suppress(OSError):
            (rid_dir(self.dump_dir, state.rid) / STATES_FILE).unlink()  # give the space back
        self._write_failure_marker(state.rid, reason, detail)

    def _write_failure_marker(self, rid: str, reason: str, detail: str) -> None:
        with self._stats_lock:
            self.requests_failed += 1
        try:
            write_failed_marker(self.dump_dir, FailureMarker(rid, reason, detail, time.time()))
        except OSError as exc:
            # The client's wait for this request then ends in 'capture_missing', and it sends it again.
            log.error("capture: cannot write %s for request %s (%s); the client will find no dump and send it "
                      "again", FAILED_FILE, rid, exc.strerror or exc)

    def _slice_done(self, state: RequestState) -> None:
        with state.lock:
            state.pending -= 1
            ready = (state.pending == 0 and state.marker is not None and not state.failed
                     and not state.done_written)
            if ready:
                state.done_written = True
        if ready:
            assert state.marker is not None
            try:
                if self._marker_shared is None:  # the same for every marker of this writer
                    self._marker_shared = state.marker.shared_json()
                write_done_marker(self._root, state.marker, self._marker_shared)
                with self._stats_lock:
                    self.requests_done += 1
            except OSError as exc:
                self._fail(state, rid_dir(self.dump_dir, state.rid) / DONE_FILE, exc)

    def _finish_job(self, job: _Job) -> None:
        if job.on_finish is not None:
            try:
                job.on_finish(job)
            except Exception:  # the batch is written; only its buffer's hand-back failed
                log.exception("capture: handing back the host buffer of a written batch failed")
        else:
            self.pool.release(job.buf)
        self._job_done()

    def _job_done(self) -> None:
        with self._cond:
            self._outstanding -= 1
            self._cond.notify_all()

    # ---- control -----------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted batch is written (or failed); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._outstanding:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(timeout=left)
        return True

    def close(self, timeout: float | None = 60) -> None:
        if self._closed:
            return
        self._closed = True
        self.flush(timeout)
        self._jobs.put(None)
        self._dispatcher.join(timeout=5)
        self._executor.shutdown(wait=True)
