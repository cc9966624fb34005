"""What the drain does with one staged dump directory: a pure decision from what it knows of it.

The scan looks at each directory of the staging area and turns what it sees (its name, its
markers, its age, the client's record) into one `Decision`. Keeping this a pure function keeps
the rules in one place, testable without files, threads or a drain:

* a probe (the client's start-up check, the smoke test) belongs to whoever sent it, and is
  removed only once it is old enough to have been forgotten, whichever run it is of;
* a dump that is not this run's (another run id, or a name no client makes) is left alone and
  reported: another drain may own it, and deleting it could lose that run's samples;
* a dump whose sample is already in the training set is garbage;
* a dump with ``failed.json`` belongs to the client, which sends the sample again (or reports
  it failed); it is removed only once long abandoned;
* a dump without ``done.json`` is still being written, or abandoned: quarantined as incomplete
  after a long silence, or soon after the finished client gave up on its sample;
* a complete dump joins its client record: no record (the client gave up on it, or never sent
  it) makes it stale after a grace period; a record of another format or output directory (see
  `same_output`) is a configuration mismatch that stops the drain; otherwise it is written.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from hsextract.output.layout import FAILURES
from hsextract.staging.records import ParsedRid, SampleRecord
from hsextract.units import duration


@dataclass(frozen=True)
class Submit:
    """Write it: validate, encode, commit."""


@dataclass(frozen=True)
class Wait:
    """Nothing to do yet."""


@dataclass(frozen=True)
class Foreign:
    """Not this run's: leave it, and report it under ``owner``."""

    owner: str


@dataclass(frozen=True)
class Remove:
    """Delete it (and its record), counted under ``why``."""

    why: str
    keep_record: bool = False


@dataclass(frozen=True)
class Quarantine:
    """Move it aside with a reason; never into the training set."""

    reason: str
    detail: str


@dataclass(frozen=True)
class Refuse:
    """A configuration mismatch: stop the drain with this message."""

    message: str


Decision = Submit | Wait | Foreign | Remove | Quarantine | Refuse

# Why a dump was removed (counted in the status file; stable strings).
ALREADY_WRITTEN = "already written"
NO_RECORD = "no client record"
PROBE_DONE = "probe left behind"
FAILED_ABANDONED = "capture failure the client never collected"
FAILED_REPORTED = "capture failure reported by the client"


@dataclass(frozen=True)
class DumpFacts:
    """What the scan saw of one dump directory.

    Its age is looked at only when a decision needs it (a dump that is incomplete, failed, a probe,
    or without record): for the complete dumps of a busy run, most of all, it is never needed, and
    it costs a stat of every file in the directory."""

    name: str
    parsed: ParsedRid | None
    complete: bool  # done.json exists
    failed: bool  # failed.json exists
    age_of: Callable[[], float] = field(compare=False, repr=False)  # seconds since anything in it was modified

    @functools.cached_property
    def age_s(self) -> float:
        return self.age_of()


@dataclass(frozen=True)
class RunFacts:
    """What the drain knows of its run."""

    run_id: str
    format: str
    output: str  # resolved path of the output directory
    written: bool  # the dump's rid or dataset index is in the manifest already
    abandoned: bool  # the finished client lists this rid in failures.jsonl
    record_grace_s: float
    incomplete_timeout_s: float
    abandoned_grace_s: float


def same_output(recorded: str, output: str) -> bool:
    """Whether a record's output directory is this drain's (`output`, resolved).

    Clients resolve --output before they write it into a record. Older ones wrote it as typed, so a
    relative path names a directory relative to a working directory the drain does not know. Such a
    record is accepted when its path, without its leading ``.``/``..`` parts, is the end of the
    drain's path (``out`` or ``runs/out`` for ``/data/runs/out``). That is safe: the record's rid
    carries this output's run id, which a client reads from this very directory's run.json, so the
    path check only guards against a client of a copied directory, and a copy under the same name
    is no sample of another run either (the run id would be the same).
    """
    if recorded == output:
        return True
    rec = PurePosixPath(recorded)
    if rec.is_absolute():
        return False
    parts = [part for part in PurePosixPath(os.path.normpath(rec)).parts if part not in (".", "..")]
    return bool(parts) and list(PurePosixPath(output).parts[-len(parts) :]) == parts


def triage_unrecorded(dump: DumpFacts, run: RunFacts) -> Decision | None:
    """The decision that needs no client record, or None when the record must be read."""
    p = dump.parsed
    if p is None:
        return Foreign("unknown")
    if p.probe:
        # Of any run: a probe is never a sample, and its sender waits seconds for it, then removes
        # it; one still here after the grace was sent from a client whose --dump-dir is another
        # (the probe landed here, it waited there), and reporting it would go on forever.
        return Remove(PROBE_DONE) if dump.age_s > run.record_grace_s else Wait()
    if p.run_id != run.run_id:
        return Foreign(f"run {p.run_id}")
    if run.written:
        # Written and recorded: whatever is left of its dump is garbage (even an incomplete one;
        # the client never resends a sample the manifest has).
        return Remove(ALREADY_WRITTEN)
    if dump.failed:
        if run.abandoned:
            return Remove(FAILED_REPORTED)
        return Remove(FAILED_ABANDONED) if dump.age_s > run.incomplete_timeout_s else Wait()
    if not dump.complete:
        if dump.age_s > run.incomplete_timeout_s:
            return Quarantine(
                "incomplete",
                f"no done.json {duration(dump.age_s)} after the dump was last written (limit "
                f"{duration(run.incomplete_timeout_s)}): the request never finished",
            )
        if dump.age_s > run.abandoned_grace_s and run.abandoned:
            return Quarantine(
                "incomplete",
                f"no done.json {duration(dump.age_s)} after the dump was last written, and "
                f"the client, now finished, gave up on this sample (see {FAILURES})",
            )
        return Wait()
    return None


def triage_recorded(dump: DumpFacts, run: RunFacts, record: SampleRecord | None) -> Decision:
    """The decision for a complete dump of this run, given the client's record (None: none)."""
    assert dump.parsed is not None
    if record is None:
        return Remove(NO_RECORD) if dump.age_s > run.record_grace_s else Wait()
    if record.index != dump.parsed.index:
        return Quarantine("record", f"record says dataset index {record.index}, rid says {dump.parsed.index}")
    if record.format and record.format != run.format:
        return Refuse(
            f"the client of run {run.run_id} writes records for the format {record.format!r}, but this "
            f"drain writes {run.format!r} (record of {dump.name}); run the client and the drain with the "
            "same --format (one run configuration)"
        )
    if record.output and not same_output(record.output, run.output):
        return Refuse(
            f"the client of run {run.run_id} names the output directory {record.output}, but this drain "
            f"writes {run.output} (record of {dump.name}); run the client and the drain with the same "
            "--output"
        )
    return Submit()
