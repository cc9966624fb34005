"""The run's status files, typed: the client's status and summary, the drain's status.

``client-status*.json``, ``client-summary*.json`` (hsextract.output.layout: one of each per client
shard) and ``drain-status.json`` are read by ``hsextract status``, the drain, collect, the fleet's
status and the Ansible roles, and written by the client, the drain and collect. Each is one
dataclass here, with one reader (`from_json`, or `read_*` for a file) and one writer (`write_*`,
through hsextract.durable), so every key is spelled once and every reader sees the same fields.

The readers accept whatever an older version wrote, as the dict readers before them did:

* a key a file lacks is None (so every field is optional): each reader says what None means to it;
* a key of a type no version writes (a hand-edited file) is not taken as that field either, and,
  as every key this version does not know, it is kept (``extra``) and written back as it was read;
* a key whose value may be written as null (`_Record.NULLABLE`) is told apart from a missing one
  (``absent``), so a file read and written again keeps its keys (``hsextract status`` tells a
  drain that records its finalizes by ``finalized_samples`` being there at all).

So ``from_json(d).to_json() == d`` for the files hsextract writes (a shard stored as ``"i/n"`` is
written back as ``[i, n]``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from hsextract.durable import atomic_write_json
from hsextract.errors import ConfigError
from hsextract.output.layout import drain_status_path
from hsextract.shard import Shard

R = TypeVar("R", bound="_Record")


def read_json_object(path: str | Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when there is no such file, it cannot be read, or it holds
    something else (a torn or foreign file is no run file)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# What a key's value must be to be taken as its field, by the field's type (a Shard is parsed).
_KINDS: dict[str, Callable[[Any], bool]] = {
    "int": _is_int,
    "float": _is_number,
    "str": lambda v: isinstance(v, str),
    "dict": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
}
_SHARD = "Shard"
_BOOKKEEPING = ("extra", "absent")  # the fields of _Record itself, no key of a file


_KEYS: dict[type, dict[str, str]] = {}


@dataclass
class _Record:
    """What the run files share: optional keys, the unknown ones kept, nulls told from absences."""

    NULLABLE: ClassVar[tuple[str, ...]] = ()  # keys written as null when None (unless absent)

    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    absent: frozenset[str] = field(default=frozenset(), repr=False, compare=False)  # NULLABLE keys not in the file

    @classmethod
    def _keys(cls) -> dict[str, str]:
        """key -> its kind: every field but the bookkeeping's, each ``X | None`` (see _KINDS); worked
        out once a class (the client writes its status every second)."""
        keys = _KEYS.get(cls)
        if keys is None:
            keys = _KEYS[cls] = {
                f.name: str(f.type).split("[")[0].split(" ")[0] for f in fields(cls) if f.name not in _BOOKKEEPING
            }
        return keys

    @classmethod
    def from_json(cls: type[R], data: Mapping[str, Any]) -> R:
        """The record of a file's object, as read (see the module docstring)."""
        kinds = cls._keys()
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            kind = kinds.get(key)
            if kind is None or value is None:
                if kind is None or key not in cls.NULLABLE:
                    extra[key] = value
            elif kind == _SHARD:
                try:
                    values[key] = Shard.from_json(value)
                except ConfigError:
                    extra[key] = value
            elif _KINDS[kind](value):
                values[key] = value
            else:
                extra[key] = value
        absent = frozenset(k for k in cls.NULLABLE if k not in data)
        return cls(**values, extra=extra, absent=absent)

    @classmethod
    def read(cls: type[R], path: str | Path) -> R | None:
        """The record in `path`; None when there is none (see `read_json_object`)."""
        data = read_json_object(path)
        return None if data is None else cls.from_json(data)

    def to_json(self) -> dict[str, Any]:
        """The file's object: every key set, the nullable ones as null unless absent, then the kept ones."""
        out: dict[str, Any] = {}
        for key, kind in self._keys().items():
            value = getattr(self, key)
            if value is not None:
                out[key] = value.to_json() if kind == _SHARD else value
            elif key in self.NULLABLE and key not in self.absent:
                out[key] = None
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    def has(self, key: str) -> bool:
        """Whether the file has `key` at all (a nullable key may be there as null)."""
        return getattr(self, key, None) is not None or (key in self.NULLABLE and key not in self.absent)


def _write(
    path: str | Path, record: _Record, *, durable: bool = True, indent: int = 1, if_changed: bool = False
) -> bool:
    """Write `record` atomically; with `if_changed`, only when the file's bytes would change
    (collect rewrites nothing a run adds nothing to). Whether it was written."""
    data = record.to_json()
    if if_changed:
        with contextlib.suppress(OSError):
            if Path(path).read_bytes() == (json.dumps(data, indent=indent, sort_keys=True) + "\n").encode():
                return False
    atomic_write_json(path, data, durable=durable, indent=indent)
    return True


# -- the client's files ------------------------------------------------------------------------------


@dataclass
class ClientStatus(_Record):
    """``client-status*.json``: a client's counters, rewritten every second while it runs
    (hsextract.client.progress), and put back as they were when a start is refused
    (hsextract.client.start_state). Collect writes one for a collected set that is not final yet
    (only ``state``, ``dataset_lines``, ``shard``, ``collected_from``)."""

    NULLABLE: ClassVar[tuple[str, ...]] = ("eta_s", "paused_reason", "paused_for_s")

    state: str | None = None  # running, paused, done, stopped, failed (collect: collecting)
    samples_total: int | None = None  # lines of the client's shard
    sent: int | None = None
    ok: int | None = None
    skipped: int | None = None
    truncated: int | None = None
    failed: int | None = None
    rejected: int | None = None
    failed_by_reason: dict[str, int] | None = None
    rejected_by_reason: dict[str, int] | None = None
    retried_by_reason: dict[str, int] | None = None
    in_flight: int | None = None
    awaiting_capture: int | None = None
    tokens: int | None = None
    tokens_per_s: float | None = None
    eta_s: float | None = None  # null: no rate yet
    paused_reason: str | None = None  # null: not paused
    paused_s: float | None = None  # every pause so far, the one under way included
    paused_for_s: float | None = None  # null: no pause under way
    error: str | None = None
    shard: Shard | None = None
    attempt: str | None = None  # which start of the client (hsextract.output.client_files.summary_id)
    pid: int | None = None
    started_at: float | None = None
    updated_at: float | None = None
    start_refused: dict[str, Any] | None = None  # error, at, pid of a refused start
    dataset_lines: int | None = None  # collect's only
    collected_from: dict[str, Any] | None = None  # collect's only: host -> its shards


@dataclass
class ClientSummary(_Record):
    """``client-summary*.json``: written once, when every sample of the client's shard has an
    outcome (the drain's ``--exit-when-done`` takes it for "no more dumps will come"). Collect
    writes one for a final collected set (only ``state``, ``dataset_lines``, ``shard``,
    ``collected_from``)."""

    state: str | None = None
    samples_total: int | None = None
    dataset_lines: int | None = None  # lines of the whole dataset (the shard's are samples_total)
    shard: Shard | None = None  # in a file named for the whole dataset, as older clients wrote
    ok: int | None = None
    skipped: int | None = None
    truncated: int | None = None
    failed: dict[str, int] | None = None  # by reason
    rejected: dict[str, int] | None = None
    retried: dict[str, int] | None = None
    tokens: int | None = None
    wall_s: float | None = None
    paused_s: float | None = None
    startup_s: dict[str, float] | None = None
    attempt: str | None = None
    finished_at: float | None = None
    collected_from: dict[str, Any] | None = None


def write_client_status(path: str | Path, status: ClientStatus, *, if_changed: bool = False) -> bool:
    """The client status file (durable: ``hsextract status`` reads the last run's after a crash)."""
    return _write(path, status, if_changed=if_changed)


def write_client_summary(path: str | Path, summary: ClientSummary, *, if_changed: bool = False) -> bool:
    return _write(path, summary, if_changed=if_changed)


# -- the drain's file ---------------------------------------------------------------------------------


@dataclass
class DrainStatus(_Record):
    """``drain-status.json``: the drain's counters, rewritten every few seconds (hsextract.drain.metrics);
    ``updated_at`` tells a reader whether the daemon is alive."""

    NULLABLE: ClassVar[tuple[str, ...]] = ("finalized_samples",)

    state: str | None = None  # starting, running, paused, stopping, stopped, done, failed
    format: str | None = None
    precision: str | None = None  # how the set stores its rows: bf16 or fp8 (absent: a drain before it, bf16)
    run_id: str | None = None
    samples: int | None = None  # written by this process
    samples_total: int | None = None  # in the manifest
    tokens: int | None = None
    tokens_total: int | None = None
    bytes: int | None = None
    bytes_total: int | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    mb_per_s: float | None = None
    lag: int | None = None
    foreign: dict[str, int] | None = None
    accounts: dict[str, Any] | None = None
    selfcheck: dict[str, Any] | None = None
    finished_client_runs: list[str] | None = None
    in_flight: int | None = None
    # The samples the dataset-level files were last written for; null: not yet. Absent: a drain of a
    # version that did not record its finalizes.
    finalized_samples: int | None = None
    finalize_problem: str | None = None
    quarantined: int | None = None
    quarantined_by_reason: dict[str, int] | None = None
    stale_removed: int | None = None
    stale_removed_by_reason: dict[str, int] | None = None
    paused_reason: str | None = None  # "": not paused
    objectstore: dict[str, Any] | None = None  # only where the set goes to a bucket
    started_at: float | None = None
    updated_at: float | None = None
    pid: int | None = None
    dump_dir: str | None = None
    quarantine_dir: str | None = None
    error: str | None = None  # why it failed


def read_drain_status(output: str | Path) -> DrainStatus | None:
    """The drain's status of `output`, or None when it has none (no drain ran, or not readable)."""
    return DrainStatus.read(drain_status_path(output))


def write_drain_status(output: str | Path, status: DrainStatus) -> None:
    # Atomic but not fsynced: the status is rewritten every few seconds and lost nothing if a crash eats it.
    _write(drain_status_path(output), status, durable=False, indent=2)
