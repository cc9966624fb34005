"""A host's output as collect sees it: read once from its files, then judged by the pure core.

A host output is a training set written by ``hsextract drain`` (on the host itself, on a shared
mount, or a copy rsync pulled into a local staging directory): its manifest header and entries,
its run id, the client's record of the dataset and of its shard, whether a drain still runs on
it, and whether its drain has caught up with its finished client. Reading it never changes it.

A host is *finished* when every client of it has finished and its own reconciliation
(hsextract.output.accounts, final) places every accepted sample in its set, its failures or its
quarantine: nothing more will be committed to it, whether its drain daemon still idles or not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsextract.collect.lock import held_by_a_process
from hsextract.contained import irregular_entries
from hsextract.errors import HsextractError
from hsextract.output.accounts import read_accounts
from hsextract.output.dataset_record import read_record
from hsextract.output.layout import (
    CLIENT_STATUS,
    CLIENT_SUMMARY,
    MANIFEST_ENTRIES,
    MANIFEST_HEADER,
    QUARANTINE_DIR,
    RUN_FILE,
    STATE_DIR,
    output_lock_path,
    state_dir,
)
from hsextract.output.manifest import ManifestEntry, ManifestError, ManifestHeader, iter_entries, read_header
from hsextract.output.run_files import ClientStatus, ClientSummary, read_drain_status
from hsextract.shard import WHOLE, Shard
from hsextract.units import duration

# What collect reads of a host output besides its sample files (those are opened row by row through
# hsextract.contained): every file under these must be a regular file, every directory a directory.
BOOKKEEPING = (MANIFEST_HEADER, MANIFEST_ENTRIES, RUN_FILE, STATE_DIR, QUARANTINE_DIR)

# A drain's status says it is working in these states (see hsextract.drain.metrics).
_DRAIN_WORKING = ("starting", "running", "paused", "stopping")


class HostUnreadable(HsextractError):
    """A host output that cannot be read at all (a wrong path, a damaged manifest)."""


@dataclass(frozen=True)
class ClientShard:
    """What one client of the host output recorded: its shard, the dataset's size, and whether it finished."""

    shard: Shard
    dataset_lines: int
    finished: bool


@dataclass
class HostOutput:
    name: str
    path: Path
    header: ManifestHeader | None  # None: nothing was drained there yet
    entries: list[ManifestEntry]
    dataset: dict[str, Any] | None  # the client's .hsextract/dataset.json
    clients: list[ClientShard] = field(default_factory=list)
    drain_busy: str = ""  # why collect thinks a drain runs on it; "" when none does
    # Accepted samples of its finished clients not yet in its set, failures or quarantine (dataset
    # indices): what its drain has still to commit. Empty while a client runs (not known yet).
    behind: list[int] = field(default_factory=list)

    @property
    def clients_finished(self) -> bool:
        return bool(self.clients) and all(c.finished for c in self.clients)

    @property
    def finished(self) -> bool:
        """Nothing more will be committed to it (see the module docstring)."""
        return self.clients_finished and not self.behind


def parse_host_argument(text: str) -> tuple[str, Path]:
    """``NAME=PATH`` or ``PATH`` (named after its last component, as rsync's staging directory per host is)."""
    name, sep, path = text.partition("=")
    if not sep or "/" in name:
        name, path = "", text
    p = Path(path)
    name = name or p.resolve().name
    if not name:
        raise HsextractError(f"host output {text!r}: give it a name (NAME=PATH)")
    return name, p


def read_host(name: str, path: Path, *, stale_after_s: float, now: float | None = None) -> HostOutput:
    """Everything collect needs of one host output; HostUnreadable when it is not one."""
    if not path.is_dir():
        raise HostUnreadable(f"{path}: no such directory")
    check_bookkeeping(path)
    try:
        header = read_header(path)
        entries = list(iter_entries(path))
        dataset = read_record(path)
    except (ManifestError, HsextractError) as exc:
        raise HostUnreadable(str(exc)) from exc
    if header is None and entries:
        raise HostUnreadable(f"{path}: manifest.jsonl has entries but manifest.json is missing")
    if header is None and not (state_dir(path)).is_dir():
        raise HostUnreadable(f"{path}: not the output of hsextract (no manifest.json, no .hsextract/)")
    clients = read_clients(path)
    behind: list[int] = []
    if clients and all(c.finished for c in clients):
        accounts = read_accounts(path, final=True)
        behind = list(accounts.unaccounted) if accounts else []
    return HostOutput(
        name,
        path,
        header,
        entries,
        dataset,
        clients,
        drain_busy(path, stale_after_s, time.time() if now is None else now),
        behind,
    )


def check_bookkeeping(path: Path) -> None:
    """HostUnreadable naming them when the host output's manifest, bookkeeping or quarantine hold a
    symbolic link or a special file: a host controls what is there, and a link read as root on the
    collector would bring the collector's own files into the set (a FIFO would hang the collect)."""
    irregular = irregular_entries(path, BOOKKEEPING)
    if irregular:
        more = f" (and {len(irregular) - 5} more)" if len(irregular) > 5 else ""
        raise HostUnreadable(
            f"{path}: {'; '.join(irregular[:5])}{more}: a host output's manifest, bookkeeping and "
            "quarantine must be regular files, and collect follows no link"
        )


def read_clients(out: Path) -> list[ClientShard]:
    """The shards the clients of `out` recorded: finished ones from their summaries, running ones
    from their status files (``client-summary*.json``, ``client-status*.json``: one per shard
    where several clients share an output)."""
    found: dict[Shard, ClientShard] = {}
    kinds: tuple[tuple[str, type[ClientSummary] | type[ClientStatus], bool], ...] = (
        (CLIENT_SUMMARY, ClientSummary, True),
        (CLIENT_STATUS, ClientStatus, False),
    )
    for base, kind, finished in kinds:
        stem, _, ext = base.rpartition(".")
        for p in sorted(state_dir(out).glob(f"{stem}*.{ext}")):
            record = kind.read(p)
            if record is None or record.dataset_lines is None:
                continue
            if record.extra.get("shard"):
                continue  # no shard a client writes: not a client's file
            shard = record.shard or WHOLE
            if shard not in found:
                found[shard] = ClientShard(shard, record.dataset_lines, finished)
    return sorted(found.values(), key=lambda c: c.shard)


def drain_busy(out: Path, stale_after_s: float, now: float) -> str:
    """Why a drain seems to run on `out` now, or "": a process holds its lock, or its status says it
    works and was written within `stale_after_s` (the only sign left on a copy of a remote host's output)."""
    if held_by_a_process(output_lock_path(out)):
        return "a process holds its lock (.hsextract/output.lock)"
    status = read_drain_status(out)
    if status and status.state in _DRAIN_WORKING:
        age = now - float(status.updated_at or 0)
        if age <= stale_after_s:
            return f"its drain's status says {status.state!r}, {duration(age)} ago"
    return ""
