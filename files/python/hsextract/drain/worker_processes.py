"""The drain's worker processes: `prepare` (hsextract.drain.prepare) run outside the drain's own
interpreter.

Why: a small sample costs the drain about 3 ms of Python (read, check, encode, write, count), and
in threads all of it is serialized by the interpreter's lock, so the drain's samples per second
stop growing at one core whatever the number of workers. In processes each worker has its own
interpreter; the drain's process keeps the scan, the ordered commit and the accounts, and its
worker threads only hand a job over and wait. Large samples gain little (their time is the
disk's and torch's, which release the lock), so the drain's default uses processes only where
there are cores for them (hsextract.drain.config).

They start in the background: a spawned interpreter takes seconds to import torch (8 of them
took 9-11 s on the H200 host's 16 cores, 25-32 s on 2 cores), then prepares one made-up sample
(hsextract.drain.warmup) so that "started" means warm; a drain that waited for them
left the staging area to fill and the client to pause for that long (bench/gpu/pipeline_gpu.py's
timeline, bench/results/pipeline_gpu_drain_start.json). Until all of them are up, `ready` is False
and the drain prepares samples in its own threads (hsextract.drain.worker).

The processes are fresh interpreters (spawned), not forks of the drain, whose threads may hold
locks at the moment of a fork; nor children of a forkserver, which a stop's SIGTERM would end,
and with it (to the pool) every process it started. They ignore SIGINT and SIGTERM: a stop
(systemd sends SIGTERM to every process of the unit) is the drain's to carry out, finishing the
samples in hand through these same processes. A process that dies anyway fails its samples'
preparation with `WorkerProcessDied` (their dumps stay staged for the next start), and the others
are killed: the pool would otherwise wait forever for processes that ignore its SIGTERM.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from hsextract.drain.prepare import Job, Outcome, prepare
from hsextract.drain.warmup import warm_up
from hsextract.formats import get_format
from hsextract.formats.base import OutputFormat

__all__ = ["WorkerProcessDied", "WorkerProcesses"]

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}

log = logging.getLogger("hsextract.drain")

# A worker process's own state, set by `_start`.
_fmt: OutputFormat | None = None
_tmp_dir: Path | None = None


class WorkerProcessDied(RuntimeError):
    """A worker process ended while preparing a sample (killed, out of memory)."""


class WorkerProcesses:
    """`n` processes that prepare samples of one format into one temporary directory."""

    def __init__(self, n: int, fmt_name: str, tmp_dir: Path):
        ctx = multiprocessing.get_context("spawn")
        self.n = n
        self._spawned_at = time.monotonic()
        # All n are spawned now, each waiting in its start for the others (the pool would start them
        # on demand, later, while a stop's SIGTERM may be on its way), and with SIGINT and SIGTERM
        # blocked from their first instruction to the moment they ignore them (a blocked signal stays
        # pending here, in the drain, and is handled once the mask is restored). Nothing waits for
        # them here: `ready` says when they are up.
        barrier = ctx.Barrier(n)
        saved = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            self._pool = ProcessPoolExecutor(
                max_workers=n, mp_context=ctx, initializer=_start, initargs=(fmt_name, str(tmp_dir), barrier)
            )
            self._started = [self._pool.submit(os.getpid) for _ in range(n)]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, saved)
        self._ready = False
        self._pending = n
        self._lock = threading.Lock()
        for f in self._started:
            f.add_done_callback(self._one_started)

    def _one_started(self, _: Future) -> None:
        """When the last process is up: ready, and said (from the pool's own thread)."""
        with self._lock:
            self._pending -= 1
            if self._pending:
                return
        if all(not f.cancelled() and f.exception() is None for f in self._started):
            self._ready = True
            log.info(
                "%d worker processes started in %.1f s; samples are prepared in them from now on",
                self.n,
                time.monotonic() - self._spawned_at,
            )

    def ready(self) -> bool:
        """Whether every process is up (False while they start); WorkerProcessDied if they could not start."""
        if self._ready:
            return True
        if not all(f.done() for f in self._started):
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
        for f in self._started:
            with contextlib.suppress(Exception):
                f.exception(timeout=timeout)
        return self.ready()

    @property
    def pids(self) -> list[int]:
        """The worker processes' pids (the pool's own record)."""
        return sorted(self._pool._processes or {})  # the executor has no public accessor

    def prepare(self, job: Job) -> Outcome:
        """Prepare `job` in one of the processes and wait for its outcome (an error of its own is raised here)."""
        try:
            return self._pool.submit(_prepare, job).result()
        except BrokenProcessPool as exc:
            self._kill_all()
            raise WorkerProcessDied(
                f"a drain worker process died while preparing {job.record.rid} ({exc}); its dump stays staged "
                "for the next start (a process killed by the kernel's OOM killer is in `journalctl -k`)"
            ) from exc

    def _kill_all(self) -> None:
        """End every worker process at once (they ignore the SIGTERM the pool ends them with)."""
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        """Let the processes finish what they were given, then end them. Processes still starting
        were given no sample: they are ended at once (their start is seconds of imports)."""
        if not all(f.done() for f in self._started):
            self._kill_all()
        self._pool.shutdown(wait=True, cancel_futures=True)


def _start(fmt_name: str, tmp_dir: str, barrier) -> None:
    global _fmt, _tmp_dir
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    import torch

    torch.set_num_threads(1)  # the processes are the parallelism
    _fmt, _tmp_dir = get_format(fmt_name), Path(tmp_dir)
    warm_up(_fmt, _tmp_dir)  # "started" means warm: the first real sample pays nothing once-only
    barrier.wait(timeout=600)


def _prepare(job: Job) -> Outcome:
    assert _fmt is not None and _tmp_dir is not None, "worker process not started"
    return prepare(_fmt, _tmp_dir, job)
