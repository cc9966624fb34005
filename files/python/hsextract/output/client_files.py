"""What the clients of an output directory say, read together: one status and one summary per shard.

An output is extracted by one client of the whole dataset, or by several clients of disjoint
shards of it (hsextract.output.lock lets those run side by side). Each client writes its own
files (hsextract.output.layout: the plain names for the whole dataset, ``.shard-i-of-n`` ones for a
shard), so that none rewrites another's. `hsextract status`, the reconciliation and the drain's
``--exit-when-done`` read them all through this module:

* the run is finished when every shard that has a status or a summary has a summary (a client
  writes its summary only once every sample of its shard has an outcome) and no client runs;
* a shard's files are told apart by the shard they are named for; files of the whole dataset
  written by an older client carry their shard inside (``shard`` of the summary).

What "every shard" is: the shards whose clients have started (written a status). A client of a
sub-shard that has not started yet is unknown to the others' readers, so several clients of one
output are started together, before the first of them can finish (a run's list of its sub-shards,
written by whatever launches them, would lift this).

A summary also says which start of the client wrote it (``attempt``, a random id per start), so
that a drain can tell the summary of the run it already finished from a new one (see
`summary_id`). Pure reading: the files are hsextract.output.run_files' records, written by
hsextract.client.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.output.layout import CLIENT_STATUS, CLIENT_SUMMARY, client_files
from hsextract.output.run_files import ClientStatus, ClientSummary
from hsextract.shard import WHOLE, Shard

# Counters of a status snapshot that add up over shards (the counts, then the rest).
_COUNTED = (
    "samples_total",
    "sent",
    "ok",
    "skipped",
    "truncated",
    "failed",
    "rejected",
    "in_flight",
    "awaiting_capture",
    "tokens",
)
_SUMMED = (*_COUNTED, "tokens_per_s", "paused_s")
_BY_REASON = ("failed_by_reason", "rejected_by_reason", "retried_by_reason")


@dataclass(frozen=True)
class ShardFiles:
    """One client shard's status and summary, as read (None: no such file, or unreadable)."""

    shard: Shard
    status: ClientStatus | None
    summary: ClientSummary | None
    summary_id: str | None


def summary_id(path: Path, summary: ClientSummary) -> str:
    """Which summary this is: its client start's ``attempt``, or, for a summary of an older client
    (or one written by hand), the file's identity (inode and modification time): a rewrite is a
    new file, atomically renamed, or at least a newer time."""
    if summary.attempt:
        return summary.attempt
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f"file:{st.st_ino}:{st.st_mtime_ns}"


def _shard_of(named: Shard, record: ClientStatus | ClientSummary | None) -> Shard:
    """A file named for the whole dataset may hold a shard's run (older clients wrote every shard so)."""
    if named == WHOLE and record is not None and record.shard is not None:
        return record.shard
    return named


def read_shards(output: str | Path) -> list[ShardFiles]:
    """Every client shard of the output with its status and summary, in shard order."""
    statuses = client_files(output, CLIENT_STATUS)
    summaries = client_files(output, CLIENT_SUMMARY)
    out = []
    for named in sorted(set(statuses) | set(summaries)):
        status = ClientStatus.read(statuses[named]) if named in statuses else None
        summary = ClientSummary.read(summaries[named]) if named in summaries else None
        sid = summary_id(summaries[named], summary) if summary is not None else None
        out.append(ShardFiles(_shard_of(named, summary or status), status, summary, sid))
    return out


def all_finished(shards: Iterable[ShardFiles]) -> bool:
    """Every shard that started has its summary (and at least one started)."""
    shards = list(shards)
    return bool(shards) and all(s.summary is not None for s in shards)


def summary_ids(shards: Iterable[ShardFiles]) -> list[str]:
    return sorted(s.summary_id for s in shards if s.summary_id)


def run_finished(shards: Iterable[ShardFiles], running_clients: int, finished_before: Collection[str]) -> bool:
    """Whether the clients' run is over, for a drain that exits when it is: every shard finished,
    no client running (a rerun's client keeps the last run's summary until its start-up checks
    pass), and the summaries are not those of a run a drain already finished (`finished_before`):
    a drain started before a rerun's client must wait for that client, not exit on the last run."""
    shards = list(shards)
    if running_clients or not all_finished(shards):
        return False
    return set(summary_ids(shards)) != set(finished_before)


def _combined_state(states: list[str]) -> str:
    for state in ("failed", "running", "paused", "stopped"):
        if state in states:
            return state
    return "done" if states and all(s == "done" for s in states) else (states[0] if states else "?")


def combined_status(shards: Iterable[ShardFiles]) -> dict[str, Any] | None:
    """One status of all the clients, for `hsextract status` (its object): a single client's own, or
    the counters of several added up (state: failed, else running, paused, stopped, done)."""
    snaps = [s.status for s in shards if s.status is not None]
    if len(snaps) <= 1:
        return snaps[0].to_json() if snaps else None
    out: dict[str, Any] = {k: sum(float(getattr(s, k) or 0) for s in snaps) for k in _SUMMED}
    for k in _COUNTED:
        out[k] = int(out[k])
    for k in _BY_REASON:
        total: Counter[str] = Counter()
        for s in snaps:
            total.update(getattr(s, k) or {})
        out[k] = dict(total)
    etas = [float(s.eta_s) for s in snaps if s.eta_s is not None]
    out.update(
        state=_combined_state([s.state or "?" for s in snaps]),
        eta_s=max(etas) if etas else None,
        paused_reason=next((s.paused_reason for s in snaps if s.paused_reason), None),
        paused_for_s=max((float(s.paused_for_s) for s in snaps if s.paused_for_s is not None), default=None),
        error="; ".join(s.error for s in snaps if s.error),
        started_at=min(float(s.started_at or 0) for s in snaps),
        updated_at=max(float(s.updated_at or 0) for s in snaps),
        pid=snaps[0].pid,
        clients=len(snaps),
        shards=[str(s.shard or WHOLE) for s in snaps],
    )
    refused = [s.start_refused for s in snaps if s.start_refused]
    if refused:
        out["start_refused"] = refused[0]
    return out
