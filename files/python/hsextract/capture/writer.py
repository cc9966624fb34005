"""Writes staged batches from host buffers into per-request files in /dev/shm.

The forward pass's part is `hsextract.capture.host_stage` (the batch taken at hook time, copied
asynchronously into a pooled host buffer) and `hsextract.capture.sink` (the queue). Here a
dispatcher thread waits for a batch's copy to land, asks the `CapturePlanner` where the rows go,
cuts the segments into tasks (`hsextract.capture.slices`) and hands them to a pool of writer
threads:

* the whole requests of a batch (short prompts: most of them) in a few groups, each request's file
  created and written in one call;
* a long or chunked request in slices, written in parallel through a shared mapping of its file
  where /dev/shm has room to spare, else with pwrite (`hsextract.capture.states_file`,
  `hsextract.capture.file_io`).

Before a writer writes rows it recomputes their fingerprint values from the host copy and compares
them with the forward pass's (`hsextract.fingerprint`). When every planned row of a complete
request is on disk, its ``done.json`` is written atomically, with the request's fingerprint and
greedy token; a request the capture cannot stage is failed, once, with ``failed.json`` for the
client (`hsextract.capture.outcomes`). Nothing here raises into the server.

With ``writer_process`` off, this runs in SGLang's scheduler process, whose GIL the writer threads
share with the scheduler thread; with it on (the default), `hsextract.capture.writer_process` runs
this writer in a child process, fed with batches that have already landed
(`CaptureWriter.submit_landed`).
"""

from __future__ import annotations

import errno
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from hsextract.capture.core import CapturePlanner, CaptureSettings, Failure, LandedMeta, Segment
from hsextract.capture.host_stage import Failures, HostBufferPool, HostStager, StagedBatch, failures_of
from hsextract.capture.outcomes import CounterAttributes, RequestOutcomes, WriterCounters, write_error
from hsextract.capture.sink import BatchQueue, WriterOptions
from hsextract.capture.slices import SliceTask, group_whole, rows_per_slice, split_whole
from hsextract.capture.states_file import StatesFileWriter
from hsextract.staging import fs as staging_fs
from hsextract.staging.dumps import CAPTURE_FINGERPRINT, CAPTURE_QUEUE_ERROR, CAPTURE_WRITE_ERROR

log = logging.getLogger("hsextract.capture")


class CaptureWriter(CounterAttributes, BatchQueue):
    """Stages captured batches as per-request files; see the module docstring."""

    def __init__(
        self,
        dump_dir: str | Path,
        settings: CaptureSettings,
        options: WriterOptions | None = None,
        *,
        device: str | torch.device = "cpu",
    ):
        self.options = options = options or WriterOptions()
        self.dump_dir = Path(dump_dir)
        staging_fs.check_root(self.dump_dir)  # never write through what another user planted
        self.settings = settings
        self.files = StatesFileWriter(self.dump_dir, options.map_margin_bytes)
        self.outcomes = RequestOutcomes(self.files)
        # The planner asks whether a complete dump is still staged before it takes a resend for one.
        self.planner = CapturePlanner(settings, is_staged=self.files.is_complete)
        device = torch.device(device)
        self.pool = HostBufferPool(
            options.max_bytes_in_flight, pin=device.type == "cuda", granularity=options.pool_granularity
        )
        self._stager = HostStager(settings, device, self.pool)
        self._jobs: queue.Queue[StagedBatch | Failures | None] = queue.Queue()
        self._executor = ThreadPoolExecutor(max_workers=max(1, options.num_threads), thread_name_prefix="hsx-write")
        self._outstanding = 0
        self._cond = threading.Condition()
        self._closed = False
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="hsx-dispatch", daemon=True)
        self._dispatcher.start()

    @property
    def counters(self) -> WriterCounters:
        """What this writer has staged so far (a copy)."""
        return self.outcomes.counters

    # ---- forward-pass side (submit_owned, submit, fail_requests: BatchQueue) -------------------
    def submit_landed(self, batch: StagedBatch) -> None:
        """Queue a batch whose host copy has landed already, in a buffer that is not this writer's
        (the writer process's, or the parent's after that process died); its ``on_finish`` is
        called once it is written, in place of giving the buffer back to this writer's pool."""
        self._enqueue(batch)

    def queue_failures(self, failures: list[Failure]) -> None:
        """Queue requests to be failed, in order with the batches around them (never blocks)."""
        if failures:
            self._enqueue(Failures(list(failures)))

    # ---- writer side (the dispatcher thread: BatchQueue._dispatch_loop) -----------------------
    def _dispatch_one(self, job: StagedBatch | Failures) -> None:
        if isinstance(job, Failures):
            self._fail(job.failures)
            self._job_done()
            return
        try:
            self._dispatch(job)
        except Exception as exc:  # never let a bug in the capture take the server down
            log.exception(
                "capture: dispatching a batch of %d requests failed; they are marked failed for the "
                "client to send again",
                len(job.requests),
            )
            self._fail(
                failures_of(
                    job.requests, CAPTURE_QUEUE_ERROR, f"dispatching the batch failed: {type(exc).__name__}: {exc}"
                )
            )
            self._finish_job(job)

    def _fail(self, failures: list[Failure]) -> None:
        """Fail requests in the planner (later chunks of them are ignored) and in the staging
        directory (dispatcher thread)."""
        for f in failures:
            self.outcomes.fail(self.planner.fail(f.rid, f.reason), f.reason, f.detail)

    def _dispatch(self, job: StagedBatch) -> None:
        if job.event is not None:
            job.event.synchronize()  # type: ignore[attr-defined]  # a torch.cuda.Event
        meta = LandedMeta(
            prompt_lens=job.prompt_lens.tolist(),
            ids=job.ids.numpy(),
            row_values=job.row_values.numpy(),
            greedy_tokens=job.greedy_tokens.tolist(),
        )
        segments = self.planner.plan(job.requests, meta)
        self._fail(self.planner.take_failures())
        mv = memoryview(job.buf.numpy())  # type: ignore[arg-type]  # a uint8 ndarray is a buffer
        per_slice_rows = rows_per_slice(self.options.slice_bytes, job.row_bytes)
        whole, parts = split_whole(segments, per_slice_rows)
        tasks = [task for seg in parts for task in self._slices(seg, job.row_bytes, per_slice_rows)]
        groups = group_whole(whole, job.row_bytes, self.options.num_threads)
        job.remaining = len(tasks) + len(groups)
        if not job.remaining:
            self._finish_job(job)
            return
        for group in groups:
            self._executor.submit(self._write_group_task, job, mv, group)
        for task in tasks:
            self._executor.submit(self._write_slice_task, job, mv, task)

    def _slices(self, seg: Segment, row_bytes: int, per_slice_rows: int) -> list[SliceTask]:
        """A segment of a long (or chunked) request as row slices for several writers; its file is
        created first if this is its first chunk, and mapped where /dev/shm has room to spare."""
        state = seg.state
        if seg.create:
            try:
                self.files.create(state.rid, state.layout)
            except OSError as exc:
                self.outcomes.fail(state, CAPTURE_WRITE_ERROR, write_error(self.files.path(state.rid), exc))
        users = -(-seg.rows // per_slice_rows)
        mapped = None
        if users > 1 and not state.failed:
            mapped = self.files.map(state.rid, state.layout, users, seg.rows * row_bytes)
        tasks = SliceTask.slices_of(seg, per_slice_rows, mapped)
        with state.lock:
            state.pending += len(tasks) - 1  # the planner counted the segment once
        return tasks

    def _write_group_task(self, job: StagedBatch, mv: memoryview, group: list[Segment]) -> None:
        """Write a group of whole requests of the batch, one after the other (one task)."""
        for seg in group:
            self._write_rows(job, mv, SliceTask.of_whole(seg))
        self._task_done(job)

    def _write_slice_task(self, job: StagedBatch, mv: memoryview, task: SliceTask) -> None:
        self._write_rows(job, mv, task)
        self._task_done(job)

    def _write_rows(self, job: StagedBatch, mv: memoryview, task: SliceTask) -> None:
        """A task's rows into its request's file, once they are checked against the forward pass's
        fingerprint values; a failure is reported, never raised."""
        state = task.seg.state
        mismatch = "" if state.failed or not self.options.verify_rows else task.mismatch(job, mv)
        error = None if state.failed or mismatch else self._put_rows(job, mv, task)
        if task.mapped is not None:
            task.mapped.done((task.end - task.start) * job.row_bytes)
        if mismatch:
            self.outcomes.fail(state, CAPTURE_FINGERPRINT, mismatch)
        elif error is not None:
            self.outcomes.fail(state, CAPTURE_WRITE_ERROR, write_error(self.files.path(state.rid), error))
        self.outcomes.slice_done(state)

    def _put_rows(self, job: StagedBatch, mv: memoryview, task: SliceTask) -> OSError | None:
        """Write the task's rows (and its segment's ids) into the request's file; the error, if any."""
        try:
            self.outcomes.wrote(self.files.write(task, job, mv))
        except OSError as exc:
            return exc
        except Exception as exc:  # a bug must not kill the writer thread silently
            log.exception("capture: unexpected error writing %s", self.files.path(task.seg.state.rid))
            return OSError(errno.EIO, str(exc))
        return None

    def _task_done(self, job: StagedBatch) -> None:
        """One writer task of the batch is over; the last one gives the host buffer back."""
        with job.lock:
            job.remaining -= 1
            last = job.remaining == 0
        if last:
            self._finish_job(job)

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
