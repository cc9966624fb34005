"""The drain's scan: one look after another at the staging directory, deciding about each dump.

A complete dump of this run that is not written yet is submitted to the workers with its client
record; every other one is acted on as `triage` decides (left to its own run's drain, removed as
stale, quarantined, or a refusal that stops the drain). The scan knows the samples in hand
(`InFlight`), the clients (`ClientRuns`, for the dumps they gave up on) and whether a sample is
written (the committer); what becomes of a sample it reports to `Outcomes`.

A full scan (every dump looked at, the lag counted) runs at most once per poll interval. A scan
woken early by a worker that freed a slot stops as soon as the queue is full again: with
thousands of dumps staged, looking at each of them after every sample would take the cores the
workers need (measured: a third of a core on 2 cores). It first takes the dumps the last full
scan found ready, and lists the directory only when they run out: with a backlog staged, a
listing after every sample was the main thread's largest cost (py-spy of
`bench/drain_small_samples.py`: 0.8 ms of its 2 ms a sample).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from hsextract.drain import triage as t
from hsextract.drain import validate as v
from hsextract.drain.clients import ClientRuns
from hsextract.drain.config import DrainConfig
from hsextract.drain.inflight import InFlight
from hsextract.drain.outcomes import Outcomes
from hsextract.drain.quarantine import safe_iterdir
from hsextract.drain.worker import SampleWorker
from hsextract.errors import ConfigError, StagingError
from hsextract.output.committer import Committer
from hsextract.process_age import process_age_s
from hsextract.staging.dumps import DONE_FILE, FAILED_FILE, iter_dump_names
from hsextract.staging.names import record_rid, records_dir
from hsextract.staging.records import SampleRecord, parse_rid, read_record

log = logging.getLogger("hsextract.drain")

# The records of written samples are swept at most this often (the scan takes most with their dumps).
RECORD_SWEEP_S = 30.0


@dataclass
class _Scan:
    """One pass over the staging directory: what it found so far."""

    now: float
    full: bool  # every dump is looked at and the lag counted (else it stops once the queue is full)
    submitted: int = 0
    lag: int = 0
    foreign: Counter[str] = field(default_factory=Counter)
    # complete dumps of this run, not written, waiting for a slot (a dict: in the order found)
    ready: dict[str, None] = field(default_factory=dict)


class Scanner:
    """Scans one staging directory for one run of one output; `scan_and_submit` runs in the drain's main thread."""

    def __init__(
        self,
        cfg: DrainConfig,
        run_id: str,
        *,
        inflight: InFlight,
        committer: Committer,
        worker: SampleWorker,
        clients: ClientRuns,
        outcomes: Outcomes,
        stop: threading.Event,
    ):
        self.cfg = cfg
        self.run_id = run_id
        self.dump_dir = Path(cfg.dump_dir)
        self._inflight = inflight
        self._committer = committer
        self._worker = worker
        self._clients = clients
        self._outcomes = outcomes
        self._stop = stop
        self._output = str(Path(cfg.output).resolve())  # as the clients' records name it
        self._last_full = 0.0
        self._last_record_sweep = 0.0
        self._foreign_reported: dict[str, int] = {}
        # The dumps the last full scan found ready (complete, of this run, not written) and no scan has
        # taken since: nothing about them can change but their record and their being taken, so a
        # full scan need not triage them again, and an early scan takes them without a listing.
        self._ready: dict[str, None] = {}
        self._took_one = False  # the first sample taken is said in the log, with the drain's age

    def scan_and_submit(self, pool: ThreadPoolExecutor) -> int:
        """Look at the staged dumps: submit complete ones to `pool`, act on the others; return how
        many were submitted."""
        now = time.monotonic()
        scan = _Scan(now=time.time(), full=now - self._last_full >= self.cfg.poll_interval_s)
        if scan.full:
            self._last_full = now
            names: Iterable[str] = iter_dump_names(self.dump_dir)
        else:
            names = iter_dump_names(self.dump_dir) if self._take_ready(scan, pool) else ()
        for name in names:
            if self._stop.is_set() or not self._look_at(name, scan, pool):
                break
        stats = self._outcomes.stats
        stats.set(in_flight=len(self._inflight))
        if scan.full:
            self._ready = scan.ready
            stats.set(lag=scan.lag)
            self._report_foreign(scan.foreign)
        if scan.submitted:
            self._inflight.touch()
        self.sweep_records(scan.now)
        return scan.submitted

    def _take_ready(self, scan: _Scan, pool: ThreadPoolExecutor) -> bool:
        """An early scan's first step: fill the free slots from the dumps the last full scan found
        ready, each triaged again (it may have been written or removed since); True when slots are
        still free and the scan should go on to list the directory."""
        while self._ready and not self._stop.is_set():
            if self._inflight.full():
                return False
            rid = next(iter(self._ready))
            del self._ready[rid]  # triaged in full below, then taken, or found again by the next full scan
            if rid not in self._inflight and not self._look_at(rid, scan, pool):
                return False
        return not self._stop.is_set()

    def sweep_records(self, now: float, force: bool = False) -> None:
        """Remove the records of this run's written samples (other runs' records are their drain's)."""
        if not force and now - self._last_record_sweep < RECORD_SWEEP_S:
            return
        self._last_record_sweep = now
        rdir = records_dir(self.dump_dir)
        try:
            names = os.listdir(rdir)
        except FileNotFoundError:
            return
        for name in names:
            rid = record_rid(name)
            p = parse_rid(rid or "")
            if rid is None or p is None:
                continue
            if (self.dump_dir / rid).exists():
                continue  # the scan decides about its dump first
            if p.run_id == self.run_id and self._committer.is_written(rid, p.index):
                with contextlib.suppress(FileNotFoundError):
                    (rdir / name).unlink()

    def _look_at(self, rid: str, scan: _Scan, pool: ThreadPoolExecutor) -> bool:
        """Decide about the staged directory `rid` and act; False when the scan should stop here."""
        if rid in self._inflight:
            scan.lag += 1
            return True
        if not scan.full and self._inflight.full():
            return False  # an early scan has filled the queue: nothing more to do until a slot frees
        d = self.dump_dir / rid
        facts = None
        if rid not in self._ready:
            facts = _facts(d, scan.now)
            decision = t.triage_unrecorded(facts, self._run_facts(facts))
            if decision is not None:
                return self._act(d, rid, decision, scan)
        # Complete, of this run, not written: it needs its record and a slot.
        scan.lag += 1
        scan.ready[rid] = None
        if self._inflight.full():
            return scan.full  # a full scan goes on to count the rest; an early one stops here
        if facts is None:
            facts = _facts(d, scan.now)
        try:
            record = read_record(self.dump_dir, rid)
        except StagingError as exc:
            self._outcomes.quarantine(d, rid, v.RECORD, str(exc))
            return True
        decision = t.triage_recorded(facts, self._run_facts(facts), record)
        if isinstance(decision, t.Submit):
            assert record is not None
            if self._submit(pool, d, record):
                scan.submitted += 1
                del scan.ready[rid]  # taken: not for a later scan to take again
            return True
        return self._act(d, rid, decision, scan)

    def _submit(self, pool: ThreadPoolExecutor, d: Path, record: SampleRecord) -> int:
        if not self._inflight.add(record.rid):
            return 0
        if not self._took_one:
            self._took_one = True
            age = process_age_s()
            log.info("first sample taken%s", "" if age is None else f", {age:.2f} s after the drain's start")
        fut = pool.submit(self._inflight.prepare, record.rid, functools.partial(self._worker.process, d, record))
        fut.add_done_callback(self._task_done)
        return 1

    def _task_done(self, fut: Future) -> None:
        exc = fut.exception() if not fut.cancelled() else None
        if exc is not None and self._outcomes.fatal is None:
            log.error("drain worker failed: %r", exc)
            self._outcomes.fail(exc)

    def _act(self, d: Path, rid: str, decision: t.Decision, scan: _Scan) -> bool:
        """Carry out a decision other than Submit; False when the drain must stop (Refuse)."""
        if isinstance(decision, t.Foreign):
            scan.foreign[decision.owner] += 1
        elif isinstance(decision, t.Remove):
            self._outcomes.stale(d, rid, decision.why)
        elif isinstance(decision, t.Quarantine):
            self._outcomes.quarantine(d, rid, decision.reason, decision.detail)
        elif isinstance(decision, t.Refuse):
            self._outcomes.fail(ConfigError(decision.message))
            return False
        return True

    def _run_facts(self, dump: t.DumpFacts) -> t.RunFacts:
        p = dump.parsed
        written = (
            p is not None and not p.probe and p.run_id == self.run_id and self._committer.is_written(dump.name, p.index)
        )
        return t.RunFacts(
            run_id=self.run_id,
            format=self.cfg.format,
            output=self._output,
            written=written,
            abandoned=(dump.failed or not dump.complete) and dump.name in self._clients.abandoned_rids(),
            record_grace_s=self.cfg.record_grace_s,
            incomplete_timeout_s=self.cfg.incomplete_timeout_s,
            abandoned_grace_s=self.cfg.abandoned_grace_s,
        )

    def _report_foreign(self, foreign: Counter[str]) -> None:
        """Say (once per owner, and again when its count grows) which dumps of other runs are left alone."""
        for owner, n in foreign.items():
            if n > self._foreign_reported.get(owner, 0):
                log.warning(
                    "staging %s holds %d dump(s) of %s, not of this drain's run %s: left alone (their own "
                    "drain takes them; remove them by hand if no such run goes on)",
                    self.dump_dir,
                    n,
                    owner,
                    self.run_id,
                )
        self._foreign_reported = dict(foreign)
        self._outcomes.stats.set(foreign=dict(foreign))


def _facts(d: Path, now: float) -> t.DumpFacts:
    path = str(d)  # plain strings: pathlib's joins cost more than the stats, once per dump per scan
    return t.DumpFacts(
        name=d.name,
        parsed=parse_rid(d.name),
        complete=os.path.exists(f"{path}/{DONE_FILE}"),
        failed=os.path.exists(f"{path}/{FAILED_FILE}"),
        age_of=functools.partial(_age, d, now),
    )


def _age(path: Path, now: float) -> float:
    """Seconds since `path` (or, for a directory, anything directly in it) was last modified."""
    try:
        latest = path.stat().st_mtime
        if path.is_dir():
            for child in safe_iterdir(path):
                with contextlib.suppress(FileNotFoundError):
                    latest = max(latest, child.stat().st_mtime)
    except FileNotFoundError:
        return 0.0
    return now - latest
