"""Writes staged batches from host buffers into per-request files in /dev/shm.

The forward pass's part is `hsextract.capture.host_stage` (the batch taken at hook time, copied
asynchronously into a pooled host buffer) and `hsextract.capture.sink` (the queue). Here a
dispatcher thread waits for a batch's copy to land, asks the `CapturePlanner` where the rows go,
and hands the work to a pool of writer threads:

* the whole requests of a batch (short prompts: most of them) in a few groups, each request's file
  created and written in one call;
* a long or chunked request in slices, written in parallel through a shared mapping of its file
  where /dev/shm has room to spare, else with pwrite (`hsextract.capture.file_io`).

Before a writer writes rows it recomputes their fingerprint values from the host copy and compares
them with the forward pass's (`hsextract.fingerprint`). When every planned row of a complete
request is on disk, its ``done.json`` is written atomically, with the request's fingerprint and
greedy token.

Every way a request can fail (a write error such as a full /dev/shm, a batch that could not be
queued, rows the capture never saw, rows that differ from the forward pass's, SGLang's placeholder
of a refused request) ends in `CaptureWriter._give_up`: logged with the reason, its partial file
removed to give the space back, never marked done, and ``failed.json`` tells the client why, so the
client sends the sample again. Nothing here raises into the server.

With ``writer_process`` off, this runs in SGLang's scheduler process, whose GIL the writer threads
share with the scheduler thread; with it on (the default), `hsextract.capture.writer_process` runs
this writer in a child process, fed with batches that have already landed
(`CaptureWriter.submit_landed`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from hsextract import fingerprint
from hsextract.capture.core import CapturePlanner, CaptureSettings, Failure, LandedMeta, RequestState, Segment
from hsextract.capture.file_io import MappedFile, pwrite_all
from hsextract.capture.host_stage import FailedRequests, HostBufferPool, HostStager, StagedBatch, failures_of
from hsextract.capture.sink import BatchQueue, WriterOptions
from hsextract.staging import fs as staging_fs
from hsextract.staging.dumps import (
    CAPTURE_FINGERPRINT,
    CAPTURE_QUEUE_ERROR,
    CAPTURE_WRITE_ERROR,
    DONE_FILE,
    FAILED_FILE,
    STATES_FILE,
    FailureMarker,
    StateFileLayout,
    rid_dir,
    write_done_marker,
    write_failed_marker,
)

log = logging.getLogger("hsextract.capture")

_MiB = 1 << 20


class CaptureWriter(BatchQueue):
    """Stages captured batches as per-request files; see the module docstring."""

    def __init__(self, dump_dir: str | Path, settings: CaptureSettings, options: WriterOptions | None = None, *,
                 device: str | torch.device = "cpu"):
        options = options or WriterOptions()
        self.options = options
        self.dump_dir = Path(dump_dir)
        staging_fs.check_root(self.dump_dir)  # never write through what another user planted
        self._root = os.fspath(self.dump_dir)  # string paths on the per-request path: pathlib costs
        # The planner asks whether a complete dump is still staged before it takes a resend for one.
        self.planner = CapturePlanner(settings, is_staged=self._complete_dump_staged)
        self.settings = settings
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.slice_bytes = max(int(options.slice_bytes), 1)
        self.map_margin_bytes = int(options.map_margin_bytes)
        self._space_lock = threading.Lock()
        self._reserved = 0
        self.pool = HostBufferPool(options.max_bytes_in_flight, pin=self.cuda, granularity=options.pool_granularity)
        self._stager = HostStager(settings, self.device, self.pool)
        self._jobs: queue.Queue[StagedBatch | FailedRequests | None] = queue.Queue()
        self.num_threads = max(1, options.num_threads)
        self._executor = ThreadPoolExecutor(max_workers=self.num_threads, thread_name_prefix="hsx-write")
        self._marker_shared: str | None = None
        self._outstanding = 0
        self._cond = threading.Condition()
        self.bytes_written = 0
        self.requests_done = 0
        self.requests_failed = 0
        self.write_errors = 0  # requests that a failed write lost (not writes: a request has many slices)
        self.fingerprint_mismatches = 0  # requests whose host copy differed from the forward pass's rows
        self._stats_lock = threading.Lock()
        self._closed = False
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="hsx-dispatch", daemon=True)
        self._dispatcher.start()

    def _complete_dump_staged(self, rid: str) -> bool:
        return os.path.exists(f"{self._root}/{rid}/{DONE_FILE}")

    # ---- forward-pass side (submit_owned, submit, fail_requests: BatchQueue) -------------------
    def submit_landed(self, batch: StagedBatch) -> None:
        """Queue a batch whose host copy has landed already, in a buffer that is not this writer's
        (the writer process's, or the parent's after that process died); its ``on_finish`` is
        called once it is written, in place of giving the buffer back to this writer's pool."""
        self._enqueue(batch)

    def queue_failures(self, failures: list[Failure]) -> None:
        """Queue requests to be marked failed, in order with the batches around them (never blocks)."""
        if failures:
            self._enqueue(FailedRequests(list(failures)))

    # ---- writer side (the dispatcher thread: BatchQueue._dispatch_loop) -----------------------
    def _dispatch_one(self, job: StagedBatch | FailedRequests) -> None:
        if isinstance(job, FailedRequests):
            self._mark_failed(job.failures)
            self._job_done()
            return
        try:
            self._dispatch(job)
        except Exception as exc:  # never let a bug in the capture take the server down
            log.exception("capture: dispatching a batch of %d requests failed; they are marked failed for the "
                          "client to send again", len(job.requests))
            detail = f"dispatching the batch failed: {type(exc).__name__}: {exc}"
            self._mark_failed(failures_of(job.requests, CAPTURE_QUEUE_ERROR, detail))
            self._finish_job(job)

    def _mark_failed(self, failures: list[Failure]) -> None:
        """Mark requests failed in the planner and leave ``failed.json`` for each (dispatcher thread)."""
        for f in failures:
            state = self.planner.fail(f.rid, f.reason)
            self._give_up(state, f.reason, f.detail)

    def _dispatch(self, job: StagedBatch) -> None:
        if job.event is not None:
            job.event.synchronize()  # type: ignore[attr-defined]  # a torch.cuda.Event
        meta = LandedMeta(prompt_lens=job.prompt_lens.tolist(), ids=job.ids.numpy(),
                          row_values=job.row_values.numpy(), greedy_tokens=job.greedy_tokens.tolist())
        segments = self.planner.plan(job.requests, meta)
        for f in self.planner.take_failures():
            state = self.planner.get(f.rid)
            if state is None:  # dropped from tracking
                state = self.planner.fail(f.rid, f.reason)
            self._give_up(state, f.reason, f.detail)
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
            self._executor.submit(self._write_group_task, job, mv, group)
        for task in tasks:
            self._executor.submit(self._write_slice_task, job, mv, *task)

    def _slices(self, seg: Segment, row_bytes: int, per_slice_rows: int
                ) -> list[tuple[Segment, int, int, bool, MappedFile | None]]:
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

    @staticmethod
    def _is_whole_slice(seg: Segment, a: int, b: int) -> bool:
        """Is rows ``[a, b)`` of the segment a whole new request, written in one call?"""
        return seg.create and seg.dst_row == 0 and a == 0 and b == seg.rows == seg.state.prompt_len

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

    def _map(self, state: RequestState, users: int, reserved: int) -> MappedFile | None:
        path = rid_dir(self.dump_dir, state.rid) / STATES_FILE
        try:
            return MappedFile(path, state.layout.file_size, users, reserved, self._unreserve)
        except (OSError, ValueError) as exc:
            self._unreserve(reserved)
            log.warning("capture: cannot map %s (%s); writing it with pwrite", path, exc)
            return None

    def _prepare_file(self, state: RequestState) -> None:
        """(Re)create the request's file at full size with its header; drop a stale marker."""
        path = self._states_path(state.rid)
        try:
            d, new = staging_fs.make_dir(self._root, state.rid)
            if not new:
                self._remove_stale_markers(d, state.rid)
            fd = staging_fs.create_file(path)
            try:
                os.ftruncate(fd, state.layout.file_size)
                pwrite_all(fd, memoryview(state.layout.header), 0)
            finally:
                os.close(fd)
        except OSError as exc:
            self._write_failed(state, path, exc)

    def _write_group_task(self, job: StagedBatch, mv: memoryview, group: list[Segment]) -> None:
        """Write a group of whole requests of the batch, one after the other (one task)."""
        for seg in group:
            self._write_rows(job, mv, seg, 0, seg.rows, True, None)
        self._task_done(job)

    def _write_slice_task(self, job: StagedBatch, mv: memoryview, seg: Segment, a: int, b: int, with_ids: bool,
                     mapped: MappedFile | None) -> None:
        self._write_rows(job, mv, seg, a, b, with_ids, mapped)
        self._task_done(job)

    def _write_rows(self, job: StagedBatch, mv: memoryview, seg: Segment, a: int, b: int, with_ids: bool,
                   mapped: MappedFile | None) -> None:
        """Rows [a, b) of a segment into its file, once they are checked against the forward pass's
        fingerprint values; a failure is reported, never raised."""
        state = seg.state
        path = self._states_path(state.rid)
        nbytes = (b - a) * job.row_bytes
        mismatch = None if state.failed or not self.options.verify_rows else self._check_rows(job, mv, seg, a, b)
        error = None if state.failed or mismatch else self._put_rows(path, job, mv, seg, a, b, with_ids, mapped)
        if mapped is not None:
            mapped.done(nbytes)
        if mismatch:
            with self._stats_lock:
                self.fingerprint_mismatches += 1
            self._give_up(state, CAPTURE_FINGERPRINT, mismatch)
        elif error is not None:
            self._write_failed(state, path, error)
        self._slice_done(state)

    @staticmethod
    def _check_rows(job: StagedBatch, mv: memoryview, seg: Segment, a: int, b: int) -> str:
        """"" if rows [a, b) of the segment in the host buffer have the values the forward pass
        computed on the device; else what differs."""
        first = seg.batch_row + a
        src = first * job.row_bytes
        ids = job.ids.numpy()[first : seg.batch_row + b]
        got = fingerprint.row_values_np(mv[src : src + (b - a) * job.row_bytes], ids, job.row_bytes)
        want = job.row_values.numpy()[first : seg.batch_row + b]
        bad = np.flatnonzero(got != want)
        if not len(bad):
            return ""
        return (f"{len(bad)} of rows {seg.dst_row + a}..{seg.dst_row + b - 1} of the host copy differ from what the "
                f"forward pass computed (first: prompt row {seg.dst_row + a + int(bad[0])}); the copy to the host "
                "read memory that had changed")

    def _task_done(self, job: StagedBatch) -> None:
        """One writer task of the batch is over; the last one gives the host buffer back."""
        with job.lock:
            job.remaining -= 1
            last = job.remaining == 0
        if last:
            self._finish_job(job)

    def _put_rows(self, path: str, job: StagedBatch, mv: memoryview, seg: Segment, a: int, b: int, with_ids: bool,
                   mapped: MappedFile | None) -> OSError | None:
        """Write rows [a, b) of the segment (and its ids) into the request's file; the error, if any."""
        try:
            layout = seg.state.layout
            nbytes = (b - a) * job.row_bytes
            src = (seg.batch_row + a) * job.row_bytes
            dst = layout.hidden_offset(seg.dst_row + a)
            whole = with_ids and self._is_whole_slice(seg, a, b)
            if whole:
                self._create_whole_file(seg.state.rid, layout, mv[src : src + nbytes], self._ids_view(job, mv, seg))
            elif mapped is not None:  # parallel: page faults do not take the inode lock
                ctypes.memmove(mapped.addr + dst, job.buf.data_ptr() + src, nbytes)
            if (mapped is None or with_ids) and not whole:
                fd = staging_fs.open_file(path, os.O_WRONLY)
                try:
                    if mapped is None:  # pwrite: tmpfs serialises these per file
                        pwrite_all(fd, mv[src : src + nbytes], dst)
                    if with_ids:
                        pwrite_all(fd, self._ids_view(job, mv, seg), layout.ids_offset(seg.dst_row))
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
    def _ids_view(job: StagedBatch, mv: memoryview, seg: Segment) -> memoryview:
        start = job.ids_offset(seg.batch_row)
        return mv[start : start + 8 * seg.rows]

    def _states_path(self, rid: str) -> str:
        return f"{self._root}/{rid}/{STATES_FILE}"

    def _create_whole_file(self, rid: str, layout: StateFileLayout, rows: memoryview, ids: memoryview) -> None:
        """Create a request's file and write all of it (header, rows, ids: contiguous) in one call."""
        d, new = staging_fs.make_dir(self._root, rid)
        if not new:
            self._remove_stale_markers(d, rid)
        fd = staging_fs.create_file(f"{d}/{STATES_FILE}")
        try:
            parts = [memoryview(layout.header), rows, ids]
            written = os.pwritev(fd, parts, 0)
            if written < layout.file_size:  # a short write: the rest, piece by piece
                flat = b"".join(parts)
                pwrite_all(fd, memoryview(flat)[written:], written)
        finally:
            os.close(fd)

    @staticmethod
    def _remove_stale_markers(d: str, rid: str) -> None:
        """Remove the markers an earlier send of the same rid left in its directory."""
        for stale in (DONE_FILE, FAILED_FILE):
            try:
                os.unlink(f"{d}/{stale}")
                log.info("rid %s: removed a stale %s left by an earlier send", rid, stale)
            except FileNotFoundError:
                pass

    def _write_failed(self, state: RequestState, path: str | Path, exc: OSError) -> None:
        """A write of the request failed: give up on it and tell the client why."""
        hint = " (/dev/shm is full: the client should pause, or the drain is not keeping up)" \
            if exc.errno == errno.ENOSPC else ""
        self._give_up(state, CAPTURE_WRITE_ERROR, f"cannot write {path}: {exc.strerror or exc}{hint}")

    def _give_up(self, state: RequestState, reason: str, detail: str) -> None:
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
        with contextlib.suppress(OSError):  # give the space back; nothing in a directory the capture did not make
            d = rid_dir(self.dump_dir, state.rid)
            staging_fs.check_own_dir(os.fspath(d))
            (d / STATES_FILE).unlink()
        self._leave_failure_marker(state.rid, reason, detail)

    def _leave_failure_marker(self, rid: str, reason: str, detail: str) -> None:
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
                self._write_failed(state, rid_dir(self.dump_dir, state.rid) / DONE_FILE, exc)

    def _finish_job(self, job: StagedBatch) -> None:
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
