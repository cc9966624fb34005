"""The drain's worker side: one staged dump and its record in, one durable temporary sample file
handed to the committer, within a byte budget shared by the workers.

A worker has the dump prepared (hsextract.drain.prepare: read, check, encode, write
``<output>/.hsextract/tmp/<rid>.tmp`` and fsync it), in its own thread or in one of the drain's
worker processes (hsextract.drain.worker_processes), and acts on the outcome: the `Prepared`
sample goes to the committer, which gives it its output index and name (see hsextract.drain.core
for the crash-safety argument); a dump that cannot become a sample is quarantined; a full output
volume pauses the worker until there is space, then the dump is prepared again. A sample chosen
for the self-check goes to the check's queue instead (hsextract.drain.check_queue), and from there
to the committer once its check passed, or to the quarantine.

Why a module of its own: each side is simpler knowing nothing of the other. The daemon
(hsextract.drain.core: recovery, status, shut-down; it knows nothing of systemd, which only runs
``hsextract drain``) and its scan (hsextract.drain.scan) decide which dumps to submit; the worker knows
nothing of the scan, the queue or the run's accounts: it gets exactly what turning one dump into
one file needs: the run's header, the committer to hand the file to, and one object to report
to (`WorkerEvents`).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from hsextract.drain.check_queue import Verdict
from hsextract.drain.header import RunHeader
from hsextract.drain.prepare import Invalid, Job, NoSpace, Ready, prepare
from hsextract.drain.selfcheck import GreedySelfCheck
from hsextract.drain.staged_io import PIECE
from hsextract.drain.validate import InvalidDump
from hsextract.drain.worker_processes import WorkerProcesses
from hsextract.formats.base import OutputFormat
from hsextract.output.committer import Prepared
from hsextract.output.manifest import default_checksum_algorithm
from hsextract.staging.dumps import STATES_FILE
from hsextract.staging.records import SampleRecord

log = logging.getLogger("hsextract.drain")

__all__ = ["SampleWorker", "torch_set_threads"]


class _ByteBudget:
    """Bounds the bytes of samples held in memory at once (one oversized sample may go alone)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._cv = threading.Condition()

    def acquire(self, n: int) -> None:
        with self._cv:
            while self.used and self.used + n > self.limit:
                self._cv.wait()
            self.used += n

    def release(self, n: int) -> None:
        with self._cv:
            self.used -= n
            self._cv.notify_all()


class WorkerEvents(Protocol):
    """What a worker reports (hsextract.drain.outcomes.Outcomes)."""

    def durable(self, rid: str, counts: tuple | None) -> None:
        """A sample's file is durable, before its commit, with its draft-vocabulary counts (None: not counted)."""

    def quarantine(self, d: Path, rid: str, reason: str, detail: str) -> None:
        """A dump that cannot become a sample."""

    def settled(self, rid: str) -> None:
        """A sample left the drain's hands (here: quarantined)."""

    def stopping(self) -> bool:
        """Whether the drain was asked to stop."""

    def pause_for_space(self, path: Path, exc: OSError, stoppable: bool = False) -> None:
        """A full volume waits for space; it does not fail. ``stoppable``: a stop ends the wait."""


class SampleWorker:
    """Prepares staged samples for the committer; `process` is safe to call from many threads at once.

    The preparation itself (hsextract.drain.prepare) runs in the calling thread, or, given
    `processes`, in one of the drain's worker processes while the thread waits (every sample, the
    chosen ones too; in the thread while the processes are still starting)."""

    def __init__(
        self,
        fmt: OutputFormat,
        out: Path,
        tmp_dir: Path,
        memory_budget_bytes: int,
        *,
        header: RunHeader,
        commit: Callable[[Prepared], None],
        events: WorkerEvents,
        selfcheck: GreedySelfCheck | None = None,
        processes: WorkerProcesses | None = None,
        count_vocab: Callable[[], bool] = lambda: False,
        durable_tmp: bool = True,
        precision: str = "bf16",
    ):
        self.fmt = fmt
        # The format's file body is the staged bytes, streamed through piece by piece (see SourceRange).
        self._streams_staged = bool(getattr(fmt, "streams_staged", False))
        self._slot_groups = getattr(fmt, "slot_groups", None) is not None
        self.out = Path(out)
        self.tmp_dir = Path(tmp_dir)
        self._budget = _ByteBudget(memory_budget_bytes)
        self._header = header  # what every dump must look like; written from the first valid dump
        self._commit = commit  # a durable temporary file goes to the committer
        self._events = events
        self._selfcheck = selfcheck  # the greedy self-check of a share of samples (None: off)
        self._processes = processes
        self._count_vocab = count_vocab  # whether the draft vocabulary is counted (it may stop)
        self._durable_tmp = durable_tmp  # fsync the temporary files (not when they only go up to a bucket)
        self._precision = precision  # how the files store the rows ("fp8": quantized by the preparation)

    def process(self, d: Path, record: SampleRecord) -> None:
        """Prepare the staged dump `d` of `record` within the byte budget, and commit or quarantine it."""
        checker = self._selfcheck if self._selfcheck is not None and self._selfcheck.chosen(record.rid) else None
        checked = checker is not None
        if self._streams_staged and not checked:
            size = PIECE  # read, checked and written piece by piece, whatever the sample's size
        else:
            # Every row is read into the drain's memory: into the format's own tensors, or for the
            # self-check into one buffer, from which a format that reorders the rows copies them.
            # (An FP8 set holds the FP8 rows, half the staged bytes, beside them.)
            copies = 2 if checked and self._slot_groups else 1.5 if self._precision == "fp8" else 1
            try:
                size = int(os.stat(d / STATES_FILE).st_size * copies)
            except FileNotFoundError:
                size = 0
        self._budget.acquire(size)
        try:
            self._process_in_budget(d, record, checker)
        finally:
            self._budget.release(size)

    def _process_in_budget(self, d: Path, record: SampleRecord, checker: GreedySelfCheck | None) -> None:
        """Prepare, then commit, quarantine, or (`checker`: a sample chosen for the self-check) queue for the check."""
        while True:
            header = self._header.header
            job = Job(
                d,
                record,
                self._header.expected(),
                header.checksum_algorithm if header is not None else default_checksum_algorithm(),
                self._count_vocab(),
                self._durable_tmp,
                checker.positions if checker is not None else 0,
                self._precision,
            )
            if self._processes is None or not self._processes.ready():
                outcome = prepare(self.fmt, self.tmp_dir, job)
            else:
                outcome = self._processes.prepare(job)
            if not isinstance(outcome, NoSpace):
                break
            if self._events.stopping():
                # Nothing of the sample left staging: the next drain writes it.
                log.warning("stopping with the output volume full: %s stays staged for the next drain", record.rid)
                return
            self._events.pause_for_space(self.out, outcome.error, stoppable=True)
        if isinstance(outcome, Invalid):
            self._events.quarantine(d, record.rid, outcome.reason, outcome.detail)
            self._events.settled(record.rid)
            return
        self._header.for_dump(outcome.marker)  # the first valid dump writes the header
        if checker is not None and outcome.check is not None:
            settle = functools.partial(self._after_check, d, record.rid, outcome)
            checker.submit(record.rid, outcome.check, record.input_ids, settle)
            return
        if checker is not None:
            checker.no_token()
        self._events.durable(record.rid, outcome.counts)
        self._commit(outcome.prepared)

    def _after_check(self, d: Path, rid: str, outcome: Ready, verdict: Verdict) -> None:
        """A checked sample's verdict (from the check's thread): committed, or quarantined with its
        temporary file removed."""
        if isinstance(verdict, InvalidDump):
            outcome.prepared.tmp.unlink(missing_ok=True)
            self._events.quarantine(d, rid, verdict.reason, verdict.detail)
            self._events.settled(rid)
            return
        outcome.prepared.greedy_check = verdict
        self._events.durable(rid, outcome.counts)
        self._commit(outcome.prepared)


def torch_set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
