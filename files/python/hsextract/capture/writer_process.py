"""The capture's writer in a child process: the scheduler process keeps only the forward pass's part.

Why: with short prompts and many requests in flight, SGLang's scheduler is bound by the round
trip of each request through its own process, not by the GPU. Whatever the capture does in that
process between a batch and its replies slows it in proportion, and the in-process writer's
per-request work (planning, mkdir/open/pwritev/close of each ``states.safetensors``, the atomic
``done.json``, failure markers) runs in threads that take the GIL from the scheduler thread
about ten times per request. With ``writer_process`` on, all of that runs in a child process
(``python -m hsextract.capture.writer_child``), and the scheduler process does O(1) work per
batch: `HostStager` concatenates the batch on the device and queues its asynchronous copy into a
host buffer (as in-process), and a dispatcher thread waits for the copy and sends one small
message to the child.

What crosses the process boundary: never the rows. Each host buffer of the pool is a memfd
mapping (MAP_SHARED; registered with CUDA so the device-to-host copy stays asynchronous), whose
descriptor goes to the child once over a unix socket pair, with a buffer id. Then, parent to
child: a batch (buffer id, the offsets of its rows, ids and prompt lengths, and its requests as
plain tuples), failures to mark (what ``fail_requests`` queues), flush; child to parent: a buffer
released (its batch is written), a flush acknowledged (with the child's counters). The messages are
`hsextract.capture.wire`'s; the buffers are `hsextract.capture.shared_buffers`'. The child
(`hsextract.capture.writer_child`) runs the ordinary `CaptureWriter` (planner, writer threads,
markers), fed with batches that have already landed. memfd memory is freed with the last mapping:
nothing is left in /dev/shm when either process dies.

If the child dies, nothing is lost silently: the parent sees the socket close, logs the child's
exit status, writes ``failed.json`` (reason ``writer_died``) for every request of every batch it
had sent and the child had not released (unless its ``done.json`` is there), and writes later
batches itself with an in-process `CaptureWriter`. The child exits, after writing what it was
sent, when the parent goes away (its end of the socket closes).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import torch

from hsextract.capture import wire
from hsextract.capture.core import CaptureSettings, Failure
from hsextract.capture.host_stage import Failures, HostBufferPool, HostStager, StagedBatch, failures_of
from hsextract.capture.outcomes import CounterAttributes, WriterCounters
from hsextract.capture.shared_buffers import SharedHostBuffers
from hsextract.capture.sink import BatchQueue, WriterOptions
from hsextract.capture.wire import MessageReader, send_message
from hsextract.capture.writer import CaptureWriter
from hsextract.capture.writer_child import landed_batch_writer, spawn_child
from hsextract.staging import fs as staging_fs
from hsextract.staging.dumps import CAPTURE_QUEUE_ERROR, CAPTURE_WRITER_DIED, DONE_FILE

log = logging.getLogger("hsextract.capture")


def exit_status(returncode: int | None) -> str:
    """A child's exit status in words."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "?"
        return f"killed by signal {-returncode} ({name})"
    return f"exit code {returncode}"


def unwritten_failures(lost: list[StagedBatch], dump_dir: Path, pid: int, returncode: int | None) -> list[Failure]:
    """What a dead child leaves to mark failed: each request of the batches it had not released,
    unless its ``done.json`` is there (the child wrote it before it died)."""
    detail = f"the capture's writer process (pid {pid}) died ({exit_status(returncode)}) before it wrote this request"
    return [
        f
        for job in lost
        for f in failures_of(job.requests, CAPTURE_WRITER_DIED, detail)
        if not (dump_dir / f.rid / DONE_FILE).exists()
    ]


class ProcessCaptureWriter(CounterAttributes, BatchQueue):
    """`CaptureSink` with the writing done by a child process; see the module docstring."""

    def __init__(
        self,
        dump_dir: str | Path,
        settings: CaptureSettings,
        options: WriterOptions | None = None,
        *,
        device: str | torch.device = "cpu",
    ):
        self.dump_dir = Path(dump_dir)
        staging_fs.check_root(self.dump_dir)  # as the child's writer will: refused here, before it starts
        self.settings = settings
        self.options = options = options or WriterOptions()
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.buffers = SharedHostBuffers(self.cuda)
        self.pool = HostBufferPool(
            options.max_bytes_in_flight,
            pin=False,
            granularity=options.pool_granularity,
            allocate=self.buffers.allocate,
            drop=self.buffers.drop,
        )
        self._stager = HostStager(settings, self.device, self.pool)
        self._jobs: queue.Queue[StagedBatch | Failures | wire.Flush | None] = queue.Queue()
        self._cond = threading.Condition()  # guards everything below
        self._in_flight: dict[int, StagedBatch] = {}  # buffer id -> batch sent to the child, not yet released
        self._outstanding = 0  # batches submitted and not yet released, failures not yet handed over
        self._handed_over = 0  # batches whose message reached the socket whole
        self._acks: dict[int, bool] = {}
        self._next_token = 0
        self._dead = False
        self._closing = False
        self._closed = False
        self._fallback: CaptureWriter | None = None
        self._counters = WriterCounters()  # the child's, as of its last flush
        self._sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = spawn_child(child_sock)
        finally:
            child_sock.close()
        self.child_pid = self._proc.pid
        send_message(self._sock, wire.Init(str(self.dump_dir), settings, options))
        log.info("capture: writing through a writer process (pid %d)", self.child_pid)
        self._reader = threading.Thread(target=self._read_loop, name="hsx-writer-reader", daemon=True)
        self._reader.start()
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="hsx-dispatch", daemon=True)
        self._dispatcher.start()

    # ---- forward-pass side: submit_owned, submit, fail_requests (BatchQueue) -------------------
    @property
    def counters(self) -> WriterCounters:
        """What the child had staged as of its last flush."""
        with self._cond:
            return self._counters

    @property
    def in_flight_batches(self) -> int:
        """Batches the child has been sent and has not released."""
        with self._cond:
            return len(self._in_flight)

    @property
    def batches_handed_over(self) -> int:
        """Batches whose message was sent to the child whole: from then on they are the child's to
        write, and the parent's death does not take them (a batch only counted in flight may still
        come back to be written here if the send fails)."""
        with self._cond:
            return self._handed_over

    @property
    def writing_in_process(self) -> bool:
        """True once the child died and this process writes the batches itself."""
        with self._cond:
            return self._dead and self._fallback is not None

    # ---- dispatcher (BatchQueue._dispatch_loop): one message per batch -----------------------
    def _dispatch_one(self, item: StagedBatch | Failures | wire.Flush) -> None:
        try:
            match item:
                case StagedBatch():
                    self._hand_over(item)
                case Failures():
                    self._hand_over_failures(item)
                case wire.Flush():
                    self._hand_over_flush(item)
        except Exception:  # never let a bug in the capture take the server down
            log.exception("capture: handing an item to the writer process failed")
            if isinstance(item, StagedBatch):
                self._not_handed_over(item, "handing the batch to the writer process failed (see the server log)")
            elif isinstance(item, Failures):
                log.error(
                    "capture: %d requests could not be marked failed: %s",
                    len(item.failures),
                    ", ".join(f"{f.rid} ({f.reason})" for f in item.failures),
                )
                self._done(1)
            else:
                with self._cond:  # the flush waits for the batches alone
                    self._acks[item.token] = True
                    self._cond.notify_all()

    def _tell(self, message: object) -> bool:
        """Send ``message`` to the child, after the buffers it must know of; False once it is gone."""
        return self.buffers.tell_child(self._sock, message)

    def _hand_over(self, job: StagedBatch) -> None:
        if job.event is not None:
            job.event.synchronize()  # type: ignore[attr-defined]  # a torch.cuda.Event
        bid = self.buffers.buffer_id(job.buf)
        with self._cond:
            dead = self._dead
            if not dead:
                self._in_flight[bid] = job
        if dead:
            self._write_here(job)
            return
        if self.buffers.tell_child(
            self._sock,
            wire.batch_message(
                bid, job.rows, job.row_bytes, job.meta_offset, job.batch_size, job.requests, job.scale_bytes
            ),
        ):
            with self._cond:
                self._handed_over += 1
            return
        with self._cond:  # not handed over whole: unless the child's death took it already, write it here
            mine = self._in_flight.pop(bid, None) is not None
        self._wait_dead()
        if mine:
            self._write_here(job)

    def _hand_over_failures(self, item: Failures) -> None:
        with self._cond:
            dead = self._dead
        if dead or not self._tell(wire.fail_message(item.failures)):
            self._wait_dead()
            assert self._fallback is not None
            self._fallback.queue_failures(item.failures)
        self._done(1)

    def _hand_over_flush(self, item: wire.Flush) -> None:
        with self._cond:
            dead = self._dead
        if not dead:
            self._tell(item)  # a failed send: the flush waits for the death instead

    def _write_here(self, job: StagedBatch) -> None:
        assert self._fallback is not None
        job.event, job.on_finish = None, self._release
        self._fallback.submit_landed(job)

    def _not_handed_over(self, job: StagedBatch, detail: str) -> None:
        """A batch that could not be handed over: its requests are marked failed (by the child, or
        here once it is gone), and its buffer goes back to the pool."""
        failures = failures_of(job.requests, CAPTURE_QUEUE_ERROR, detail)
        with self._cond:
            for bid, other in list(self._in_flight.items()):
                if other is job:
                    del self._in_flight[bid]
            dead = self._dead
        if dead or not self._tell(wire.fail_message(failures)):
            self._wait_dead()
            if self._fallback is not None:
                self._fallback.queue_failures(failures)
        self._release(job)

    def _release(self, job: StagedBatch) -> None:
        self.pool.release(job.buf)
        self._done(1)

    def _done(self, n: int) -> None:
        with self._cond:
            self._outstanding -= n
            self._cond.notify_all()

    # ---- reader: releases, acknowledgements, the child's death --------------------------------
    def _read_loop(self) -> None:
        reader = MessageReader(self._sock)
        try:
            while True:
                msg = reader.read()
                if msg is None:
                    break
                match msg:
                    case wire.Released(buffer_id=bid):
                        with self._cond:
                            job = self._in_flight.pop(bid, None)
                        if job is not None:
                            self._release(job)
                    case wire.Flushed(token=token, counters=counters):
                        with self._cond:
                            self._counters = counters
                            self._acks[token] = True
                            self._cond.notify_all()
        except Exception:
            log.exception("capture: reading from the writer process (pid %d) failed", self.child_pid)
        finally:
            reader.close()
        with self._cond:
            quiet = self._closing and not self._in_flight
        if quiet:
            with self._cond:
                self._dead = True
                self._cond.notify_all()
            return
        self._failover()

    def _failover(self) -> None:
        """The child is gone: fail what it had not written, and write from now on in this process."""
        try:
            returncode = self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # its socket closed, yet it lives on: end it
            self._proc.kill()
            returncode = self._proc.wait()
        fallback = landed_batch_writer(self.dump_dir, self.settings, self.options)
        with self._cond:
            lost = list(self._in_flight.values())
            self._in_flight.clear()
            failures = unwritten_failures(lost, self.dump_dir, self.child_pid, returncode)
            fallback.queue_failures(failures)  # queued before any batch written here from now on
            self._fallback = fallback
            self._dead = True
            self._cond.notify_all()
        log.error(
            "capture: the writer process (pid %d) died (%s); %d requests of the %d batches it had not "
            "written are marked failed (%s) for the client to send again; from now on this process writes "
            "the batches itself",
            self.child_pid,
            exit_status(returncode),
            len(failures),
            len(lost),
            CAPTURE_WRITER_DIED,
        )
        for job in lost:
            self._release(job)
        self.buffers.close()

    def _wait_dead(self) -> None:
        """Wait until the reader has seen the child go and set up the in-process writer."""
        with self._cond:
            while not (self._dead and (self._fallback is not None or self._closing)):
                self._cond.wait(timeout=1.0)

    # ---- control -------------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every batch submitted so far is written (or failed); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        with self._cond:
            token = self._next_token
            self._next_token += 1
            self._acks[token] = False
        self._jobs.put(wire.Flush(token))
        with self._cond:
            try:
                while not (self._acks[token] or self._dead) or self._outstanding:
                    wait = left()
                    if wait == 0:
                        return False
                    self._cond.wait(timeout=1.0 if wait is None else min(wait, 1.0))
            finally:
                self._acks.pop(token, None)
            fallback = self._fallback
        return fallback.flush(left()) if fallback is not None else True

    def close(self, timeout: float | None = 60) -> None:
        """Flush, let the child finish and exit, and give every shared buffer back."""
        if self._closed:
            return
        self._closed = True
        self.flush(timeout)
        with self._cond:
            self._closing = True
        self._jobs.put(None)
        self._dispatcher.join(timeout=5)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)  # the child's EOF: it writes what it has, then exits
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.error(
                "capture: the writer process (pid %d) did not exit within %s s of the close; killing it",
                self.child_pid,
                timeout,
            )
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=30)
        self._sock.close()
        if self._fallback is not None:
            self._fallback.close(timeout)
        self.pool.clear()
        self.buffers.close()
