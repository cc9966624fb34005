"""Sample records and request ids: the contract between the client and the drain.

Before the client sends a sample it writes the sample's record (dataset index, token ids, loss
mask) to ``<dump_dir>/_records/<rid>.json``. The drain joins each complete dump with its record
by rid, checks that the server ran exactly those tokens, and writes the loss mask beside the
states. Records live next to the dumps (in RAM) because they are needed exactly as long as the
dump is staged; after a reboot both are gone and the client sends the sample again.

A request id is ``<prefix>-<run id>-<index>``: the prefix tells the capture which requests to
write (never health checks or warmup), the run id tells the drain which dumps belong to this
output directory, and the index is the sample's stable position in the dataset. A probe (the
client's start-up check, the smoke test) is ``<prefix>-<run id>-p<hex>``: the capture writes it
like a sample, the drain never takes it for one, and whoever sent it removes it.

A record also carries the run's identity as the client knows it (format, final-norm placement,
output directory), so a drain configured otherwise refuses to write what it would get wrong.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, fields
from pathlib import Path

from hsextract.durable import atomic_write_bytes, remove_orphaned_temporaries_in
from hsextract.errors import ConfigError, StagingError
from hsextract.staging.fs import FILE_MODE, make_dir, prepare_root
from hsextract.staging.names import RECORDS_DIR, record_path

_RID_RE = re.compile(
    r"^(?P<prefix>[A-Za-z0-9_.]+)-(?P<run>[0-9a-f]{8,32})-(?:(?P<index>\d+)|p(?P<probe>[0-9a-f]{4,32}))$"
)
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.]+$")


def check_prefix(prefix: str) -> str:
    """Validate a rid prefix: letters, digits, '_' and '.', so rids stay unambiguous file names."""
    if not _PREFIX_RE.match(prefix or "") or prefix.upper().startswith("HEALTH_CHECK"):
        raise ConfigError(
            f"rid prefix {prefix!r}: use letters, digits, '_' or '.', not starting with HEALTH_CHECK (e.g. 'hsx')"
        )
    return prefix


def make_rid(prefix: str, run_id: str, index: int) -> str:
    return f"{prefix}-{run_id}-{index}"


def make_probe_rid(prefix: str, run_id: str) -> str:
    """A fresh probe rid of the run: captured like a sample, never drained as one."""
    return f"{prefix}-{run_id}-p{secrets.token_hex(6)}"


@dataclass(frozen=True)
class ParsedRid:
    prefix: str
    run_id: str
    index: int  # -1 for a probe
    probe: bool = False


def parse_rid(rid: str) -> ParsedRid | None:
    """Split a rid made by `make_rid` or `make_probe_rid`; None for anything else (health checks,
    warmup, strangers)."""
    m = _RID_RE.match(rid)
    if not m:
        return None
    if m["probe"] is not None:
        return ParsedRid(m["prefix"], m["run"], -1, probe=True)
    return ParsedRid(m["prefix"], m["run"], int(m["index"]))


@dataclass
class SampleRecord:
    """What the client knows of a sample before the server runs it."""

    rid: str
    index: int
    input_ids: list[int]
    loss_mask: list[int]
    run_id: str = ""
    source: str = ""  # "<dataset file>:<line>" for messages
    # The run's identity as the client knows it; the drain refuses records that disagree with it.
    format: str = ""
    output: str = ""


_RECORDS_SWEPT: set[str] = set()  # records directories this process has swept and created


def write_record(dump_dir: str | Path, record: SampleRecord) -> Path:
    """Write a record atomically (temporary name, then rename); return its path.

    Once per sample, so kept cheap: the record's fields are encoded as they are (`asdict` would
    deep-copy its id lists first), and the records directory is created and swept of dead writers'
    temporaries once per process rather than listed at every write."""
    if len(record.input_ids) != len(record.loss_mask):
        raise StagingError(
            f"record {record.rid}: {len(record.input_ids)} input ids but {len(record.loss_mask)} loss-mask values"
        )
    final = record_path(dump_dir, record.rid)
    directory = str(final.parent)
    if directory not in _RECORDS_SWEPT:
        make_dir(prepare_root(dump_dir), RECORDS_DIR)
        remove_orphaned_temporaries_in(final.parent)
        _RECORDS_SWEPT.add(directory)
    body = json.dumps({f: getattr(record, f) for f in _RECORD_FIELDS}, separators=(",", ":")).encode()
    try:
        # Not durable: the staging directory is a ramdisk that a reboot empties anyway. 0600: a
        # record holds the prompt's token ids.
        atomic_write_bytes(final, body, durable=False, swept=True, mode=FILE_MODE)
    except FileNotFoundError:  # the records directory was removed since (a test, an operator): again, whole
        _RECORDS_SWEPT.discard(directory)
        return write_record(dump_dir, record)
    return final


_RECORD_FIELDS = tuple(f.name for f in fields(SampleRecord))


def read_record(dump_dir: str | Path, rid: str) -> SampleRecord | None:
    """The record for `rid`, or None if the client never wrote one."""
    p = record_path(dump_dir, rid)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StagingError(f"{p}: unreadable sample record ({exc})") from exc
    return SampleRecord(**{k: data[k] for k in SampleRecord.__dataclass_fields__ if k in data})


def remove_record(dump_dir: str | Path, rid: str) -> None:
    record_path(dump_dir, rid).unlink(missing_ok=True)
