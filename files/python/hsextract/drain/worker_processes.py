"""The drain's worker processes: `prepare` (hsextract.drain.prepare) run outside the drain's own
interpreter.

Why: a small sample costs the drain about 3 ms of Python (read, check, encode, write, count), and
in threads all of it is serialized by the interpreter's lock, so the drain's samples per second
stop growing at one core whatever the number of workers. In processes each worker has its own
interpreter; the drain's process keeps the scan, the ordered commit and the accounts, and its
worker threads only hand a job over and wait. Large samples gain little (their time is the
disk's and torch's, which release the lock), so the drain's default uses processes only where
there are cores for them (hsextract.drain.config).

They are forked from a forkserver (hsextract.drain.forkserver_preload): one fresh interpreter
that imports torch and the formats once, not a fork of the drain, whose threads may hold locks at
the moment of a fork. Spawned one by one, each importing torch itself, 8 of them took 9-11 s on
the H200 host's 16 cores and 25-32 s on 2 cores. Each then prepares one made-up sample
(hsextract.drain.warmup) so that "started" means warm. They start in the background: a drain that
waited for them left the staging area to fill and the client to pause for that long
(bench/gpu/pipeline_gpu.py's timeline, bench/results/pipeline_gpu_drain_start.json). Until all of
them are up, `ready` is False and the drain prepares samples in its own threads
(hsextract.drain.worker).

They and their server ignore SIGINT and SIGTERM: a stop (systemd sends SIGTERM to every process
of the unit) is the drain's to carry out, finishing the samples in hand through these same
processes. A process that dies anyway fails its samples'
preparation with `WorkerProcessDied` (their dumps stay staged for the next start), and the others
are killed: the pool would otherwise wait forever for processes that ignore its SIGTERM.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from hsextract.drain import forkserver
from hsextract.drain.prepare import Job, Outcome, prepare
from hsextract.drain.warmup import warm_up
from hsextract.formats import get_format
from hsextract.formats.base import OutputFormat
from hsextract.process_age import process_age_s

__all__ = ["WorkerProcessDied", "WorkerProcesses"]


log = logging.getLogger("hsextract.drain")

# A worker process's own state, set by `_start`.
_fmt: OutputFormat | None = None
_tmp_dir: Path | None = None


class WorkerProcessDied(RuntimeError):
    """A worker process ended while preparing a sample (killed, out of memory)."""


class WorkerProcesses:
    """`n` processes that prepare samples of one format into one temporary directory."""

    def __init__(
        self,
        n: int,
        fmt_name: str,
        tmp_dir: Path,
        on_ready: Callable[[], None] = lambda: None,
        precision: str = "bf16",
    ):
        self.n = n
        self._on_ready = on_ready  # called once, from the pool's thread, when every process is up
        self._spawned_at = time.monotonic()
        self._ready = False
        self._pending = n
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._started: list[Future] = []
        self._launch_error: BaseException | None = None
        self._closed = False  # closed before the pool had started: the launcher ends what it starts
        # The pool's first worker waits for the forkserver's imports (seconds): started from a thread
        # of its own, so the drain goes on meanwhile. `ready` says when they are up.
        self._launched = threading.Event()
        self._launcher = threading.Thread(
            target=self._launch, args=(fmt_name, tmp_dir, precision), name="drain-worker-start", daemon=True
        )
        self._launcher.start()

    def _launch(self, fmt_name: str, tmp_dir: Path, precision: str) -> None:
        """Start the forkserver (under `hsextract drain` it runs already: forkserver.start) and all n
        processes, each waiting in its start for the others (the pool would start them on demand,
        later, while a stop's SIGTERM may be on its way)."""
        pool = None
        try:
            ctx = forkserver.start()
            pool = ProcessPoolExecutor(
                max_workers=self.n,
                mp_context=ctx,
                initializer=_start,
                initargs=(fmt_name, str(tmp_dir), ctx.Barrier(self.n), os.getpid(), precision),
            )
            started = [pool.submit(os.getpid) for _ in range(self.n)]
        except BaseException as exc:  # said by `ready`, in the drain's own thread
            if pool is not None:
                # The processes started so far wait at the barrier for the others, and a drain that
                # is exiting (a submit after the interpreter's shutdown began raises) waits for them
                # at its exit: 10 minutes, the barrier's timeout. They are given nothing: end them.
                _kill(pool)
                pool.shutdown(wait=False, cancel_futures=True)
            self._launch_error = exc
            self._launched.set()
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self._pool, self._started = pool, started
            self._launched.set()
        if closed:  # the drain finished before its processes were up: they were given nothing
            _kill(pool)
            pool.shutdown(wait=False, cancel_futures=True)
            return
        for f in started:
            f.add_done_callback(self._one_started)

    def _one_started(self, _: Future) -> None:
        """When the last process is up: ready, and said (from the pool's own thread)."""
        with self._lock:
            self._pending -= 1
            if self._pending:
                return
        if all(not f.cancelled() and f.exception() is None for f in self._started):
            self._ready = True
            age = process_age_s()
            log.info(
                "%d worker processes started in %.1f s%s; samples are prepared in them from now on",
                self.n,
                time.monotonic() - self._spawned_at,
                "" if age is None else f", {age:.1f} s after the drain's start",
            )
            self._on_ready()

    def ready(self) -> bool:
        """Whether every process is up (False while they start); WorkerProcessDied if they could not start."""
        if self._ready:
            return True
        if not self._launched.is_set():
            return False
        if self._launch_error is not None:
            raise WorkerProcessDied(
                f"the drain's {self.n} worker processes could not start ({self._launch_error}); run the drain "
                "with --worker-mode threads"
            ) from self._launch_error
        if self._pool is None or not all(f.done() for f in self._started):  # (None: closed before it started)
            return False
        try:
            for f in self._started:
                f.result()
        except BrokenProcessPool as exc:
            self._kill_all()
            raise WorkerProcessDied(
                f"the drain's {self.n} worker processes could not start ({exc}); run the drain "
                "with --worker-mode threads, and see the lines above for the cause"
            ) from exc
        self._ready = True  # (the last process's callback may not have run yet; it says so when it does)
        return True

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until every process is up (or `timeout` passes); what `ready` then says."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._launched.wait(timeout)
        for f in self._started:
            with contextlib.suppress(Exception):
                f.exception(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self.ready()

    @property
    def pids(self) -> list[int]:
        """The worker processes' pids (the pool's own record; none before the pool has started them)."""
        return _pids(self._pool) if self._pool is not None else []

    def prepare(self, job: Job) -> Outcome:
        """Prepare `job` in one of the processes and wait for its outcome (an error of its own is raised here)."""
        pool = self._pool
        assert pool is not None, "prepare() before the worker processes are ready"
        try:
            return pool.submit(_prepare, job).result()
        except BrokenProcessPool as exc:
            self._kill_all()
            raise WorkerProcessDied(
                f"a drain worker process died while preparing {job.record.rid} ({exc}); its dump stays staged "
                "for the next start (a process killed by the kernel's OOM killer is in `journalctl -k`)"
            ) from exc

    def _kill_all(self) -> None:
        """End every worker process at once (they ignore the SIGTERM the pool ends them with)."""
        if self._pool is not None:
            _kill(self._pool)

    def close(self) -> None:
        """Let the processes finish what they were given, then end them. Processes still starting
        were given no sample: they are ended at once. A pool still waiting for the forkserver's
        imports is not waited for: its launcher ends the processes it starts (a drain whose run is
        shorter than its processes' start exits when the run is done, not seconds later)."""
        with self._lock:
            self._closed = True
            if not self._launched.is_set():
                return
        if self._pool is None:
            return
        if not all(f.done() for f in self._started):
            self._kill_all()
        self._pool.shutdown(wait=True, cancel_futures=True)


def _pids(pool: ProcessPoolExecutor) -> list[int]:
    """The pids of `pool`'s processes (its own record: the executor has no public accessor)."""
    return sorted(pool._processes or {})


def _kill(pool: ProcessPoolExecutor) -> None:
    """SIGKILL every process of `pool` (they ignore the SIGTERM the pool ends them with)."""
    for pid in _pids(pool):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _start(fmt_name: str, tmp_dir: str, barrier, drain_pid: int, precision: str) -> None:
    global _fmt, _tmp_dir
    for sig in forkserver.STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, forkserver.STOP_SIGNALS)
    _exit_with(drain_pid)
    import torch

    torch.set_num_threads(1)  # the processes are the parallelism
    _fmt, _tmp_dir = get_format(fmt_name), Path(tmp_dir)
    warm_up(_fmt, _tmp_dir, precision)  # "started" means warm: the first real sample pays nothing once-only
    barrier.wait(timeout=600)


def _exit_with(drain_pid: int) -> None:
    """End this process when the drain's ends, however it ends.

    Why: a worker waits on its pool's queue, whose both ends it holds, and ignores SIGTERM; the
    forkserver lives while any worker does. A drain killed with SIGKILL (or by the OOM killer)
    left them all running, and systemd's restart waited for its stop timeout to SIGKILL them."""
    try:
        fd = os.pidfd_open(drain_pid)
    except ProcessLookupError:  # gone already
        os._exit(1)

    def watch() -> None:
        select.select([fd], [], [])  # readable once the process has exited
        os._exit(1)

    threading.Thread(target=watch, name="drain-watch", daemon=True).start()


def _prepare(job: Job) -> Outcome:
    assert _fmt is not None and _tmp_dir is not None, "worker process not started"
    return prepare(_fmt, _tmp_dir, job)
