"""The drain's worker side: one staged dump and its record in, one durable temporary sample file out.

A worker reads and checks the staged dump, has the format encode it, writes
``<output>/.hsextract/tmp/<rid>.tmp`` and fsyncs it, all within a byte budget shared by the
workers, and hands the `Prepared` sample to the committer, which gives it its output index and
name (see hsextract.drain.core for the crash-safety argument). A dump that cannot become a
sample is quarantined instead; a full output volume pauses the write until there is space.

Why a module of its own: each side is simpler knowing nothing of the other. The daemon
(hsextract.drain.core: recovery, status, shut-down; it knows nothing of systemd, which only runs
``hsextract drain``) and its scan (hsextract.drain.scan) decide which dumps to submit; the worker knows
nothing of the scan, the queue or the run's accounts: it gets exactly what turning one dump into
one file needs: the run's header, the committer to hand the file to, and one object to report
to (`WorkerEvents`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from hsextract.drain import validate as v
from hsextract.drain.committer import Prepared
from hsextract.drain.header import RunHeader
from hsextract.drain.selfcheck import GreedySelfCheck
from hsextract.drain.staged_io import MappedStates, map_states
from hsextract.durable import PIECE, is_no_space, write_payload_durably
from hsextract.errors import StagingError
from hsextract.formats.base import OutputFormat, Sample, SourceRange
from hsextract.formats.manifest import new_hasher
from hsextract.records import SampleRecord
from hsextract.staging import STATES_FILE, DoneMarker, read_done_marker

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

    def durable(self, sample: Sample) -> None:
        """A sample's file is durable: `sample` holds the tensors just written, before the commit."""

    def quarantine(self, d: Path, rid: str, reason: str, detail: str) -> None:
        """A dump that cannot become a sample."""

    def settled(self, rid: str) -> None:
        """A sample left the drain's hands (here: quarantined)."""

    def pause_for_space(self, path: Path, exc: OSError) -> None:
        """A full volume waits for space; it does not fail."""


class SampleWorker:
    """Prepares staged samples for the committer; `process` is safe to call from many threads at once."""

    def __init__(self, fmt: OutputFormat, out: Path, tmp_dir: Path, memory_budget_bytes: int, *,
                 header: RunHeader, commit: Callable[[Prepared], None], events: WorkerEvents,
                 selfcheck: GreedySelfCheck | None = None):
        self.fmt = fmt
        # The format's file body is the staged bytes, checked as they are sent (see SourceRange).
        self._streams_staged = bool(getattr(fmt, "streams_staged", False))
        self.out = Path(out)
        self.tmp_dir = Path(tmp_dir)
        self._budget = _ByteBudget(memory_budget_bytes)
        self._header = header  # what every dump must look like; written from the first valid dump
        self._commit = commit  # a durable temporary file goes to the committer
        self._events = events
        self._selfcheck = selfcheck  # the greedy self-check of a share of samples (None: off)

    def process(self, d: Path, record: SampleRecord) -> None:
        """Prepare the staged dump `d` of `record` within the byte budget, and commit or quarantine it."""
        if self._streams_staged:
            size = PIECE  # sent from the mapping piece by piece, whatever the sample's size
        else:
            # Mapping the staged file costs no memory (the pages are tmpfs's own), but the
            # format's reordered copy of the rows does: about the sample's size.
            try:
                size = (d / STATES_FILE).stat().st_size
            except FileNotFoundError:
                size = 0
        self._budget.acquire(size)
        try:
            self._process_in_budget(d, record)
        finally:
            self._budget.release(size)

    def _process_in_budget(self, d: Path, record: SampleRecord) -> None:
        rid = record.rid
        mapped = None
        failure: tuple[str, str] | None = None
        try:
            marker = read_done_marker(d)
            mapped = map_states(d / STATES_FILE)
            v.validate(marker, mapped.states, record, self._header.expected(), check_values=not self._streams_staged)
            fp = v.check_fingerprint(marker, mapped.states)
            greedy = self._selfcheck.check(marker, mapped.states) if self._selfcheck is not None else ""
            prepared = self._write_temporary(d, record, marker, mapped)
            prepared.fingerprint, prepared.greedy_check = fp, greedy
        except StagingError as exc:
            failure = (v.UNREADABLE, str(exc))
        except v.InvalidDump as exc:  # from the checks, or met while streaming the rows
            failure = (exc.reason, exc.detail)
        finally:
            if mapped is not None:
                mapped.close()
        if failure is not None:
            self._events.quarantine(d, rid, *failure)
            self._events.settled(rid)
            return
        self._commit(prepared)

    def _write_temporary(self, d: Path, record: SampleRecord, marker: DoneMarker, mapped: MappedStates) -> Prepared:
        """Encode a validated dump into its durable temporary file; the committer gives it its name."""
        header = self._header.for_dump(marker)
        states = mapped.states
        staged = SourceRange(mapped.fd, mapped.data_start, mapped.data_len, mapped.view)
        if self._streams_staged:
            h = states.hidden
            staged.check = v.finite_checker(h.dtype, h.shape[1] * h.shape[2] * h.element_size())
            staged.check_len = mapped.hidden_len
        sample = Sample(
            rid=record.rid,
            dataset_index=record.index,
            input_ids=states.input_ids,
            loss_mask=_as_int64(record.loss_mask),
            hidden=states.hidden,
            staged=staged,
        )
        payload = self.fmt.encode(sample)
        tmp = self.tmp_dir / f"{record.rid}.tmp"
        while True:
            hasher = new_hasher(header.checksum_algorithm)
            try:
                nbytes = write_payload_durably(tmp, payload, hasher)
                break
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                self._events.pause_for_space(self.out, exc)
        checksum = f"{header.checksum_algorithm}:{hasher.hexdigest()}"
        self._events.durable(sample)
        return Prepared(record.rid, record.index, len(record.input_ids), tmp, nbytes, checksum, d)


def torch_set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _as_int64(values: list[int]):  # -> torch.Tensor
    import torch

    return torch.tensor(values, dtype=torch.int64)
