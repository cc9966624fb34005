"""The collected set's own bookkeeping, in the files a drain's output has, for the whole fleet.

So that the collected set is read like any output directory (``hsextract.output.accounts.read_accounts``,
``hsextract finalize --verify``, the card), collect writes into it:

* ``run.json`` and ``.hsextract/dataset.json``: the fleet's run id and dataset record (the hosts');
* ``.hsextract/rejects.jsonl`` and ``failures.jsonl``: every host's lines, each with its ``host``,
  plus the samples that failed verification at collect; a host not given this time keeps the
  lines it had;
* ``quarantine/<rid>/``: each host's quarantine reasons (``reason.txt``, ``source.json``,
  ``record.json``, not the staged states) and ``host.json`` naming the host;
* ``.hsextract/client-summary.json`` once every host has finished and the shards cover the
  dataset, ``client-status.json`` before: the dataset's lines as one shard, 0/1 (the client's
  own records, hsextract.output.run_files, with only the keys a collected set has).

Every file is replaced only when its bytes change, so a collect that adds nothing changes nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from hsextract.collect.hosts import HostOutput
from hsextract.contained import UnsafePath, list_dir, read_regular
from hsextract.durable import atomic_write_bytes
from hsextract.output.layout import (
    FAILURES,
    QUARANTINE_DIR,
    QUARANTINE_HOST,
    QUARANTINE_REASON,
    QUARANTINE_RECORD,
    QUARANTINE_SOURCE,
    REJECTS,
    client_status_path,
    client_summary_path,
    dataset_record_path,
    default_quarantine_dir,
    failures_path,
    rejects_path,
    run_file_path,
    state_dir,
)
from hsextract.output.run_files import ClientStatus, ClientSummary, write_client_status, write_client_summary
from hsextract.shard import WHOLE


def write_if_changed(path: Path, data: bytes) -> bool:
    """Replace `path` atomically and durably with `data` unless it holds those bytes already."""
    with contextlib.suppress(OSError):
        if path.read_bytes() == data:
            return False
    atomic_write_bytes(path, data)
    return True


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


def write_identity(out: Path, run_id: str, dataset: dict[str, Any] | None) -> None:
    write_if_changed(run_file_path(out), json.dumps({"run_id": run_id}).encode())
    if dataset is not None:
        write_if_changed(dataset_record_path(out), _json_bytes(dataset))


def host_lines(h: HostOutput, base: str) -> list[dict[str, Any]]:
    """The lines of every file of kind `base` of a host output, each with its host."""
    stem, _, ext = base.rpartition(".")
    out = []
    for p in sorted(state_dir(h.path).glob(f"{stem}*.{ext}")):
        with contextlib.suppress(OSError), open(p, encoding="utf-8", errors="replace") as f:
            for line in f:
                with contextlib.suppress(ValueError):
                    obj = json.loads(line)
                    if isinstance(obj, dict) and "index" in obj:
                        out.append({**obj, "host": h.name})
    return out


def merge_lines(path: Path, hosts: Sequence[HostOutput], base: str, extra: Iterable[dict[str, Any]] = ()) -> bool:
    """Write the merged `base` file: the given hosts' lines now, the earlier lines of hosts not
    given, and `extra` (keyed lines replace none: each is one event)."""
    given = {h.name for h in hosts}
    kept = [d for d in _read_lines(path) if d.get("host") not in given and not d.get("collect")]
    lines = kept + [d for h in hosts for d in host_lines(h, base)] + [{**d, "collect": True} for d in extra]
    lines.sort(key=lambda d: (int(d.get("index", -1)), str(d.get("host")), json.dumps(d, sort_keys=True)))
    return write_if_changed(
        path, "".join(json.dumps(d, sort_keys=True, ensure_ascii=False) + "\n" for d in lines).encode()
    )


def write_merged_lists(out: Path, hosts: Sequence[HostOutput], collect_failures: Iterable[dict[str, Any]]) -> None:
    merge_lines(rejects_path(out), hosts, REJECTS)
    merge_lines(failures_path(out), hosts, FAILURES, collect_failures)


def copy_quarantine(out: Path, hosts: Sequence[HostOutput]) -> list[str]:
    """Bring each host's quarantine reasons into the collected set; return a line for each one left
    out because it is not a regular file inside the host output (hsextract.contained: no link is
    followed, so a host cannot bring the collector's files in this way)."""
    left_out: list[str] = []
    for h in hosts:
        try:
            names = list_dir(h.path, QUARANTINE_DIR)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except UnsafePath as exc:
            left_out.append(f"host {h.name}: its quarantine was not copied: {exc}")
            continue
        for rid in names:
            if not rid.startswith("."):
                _copy_quarantined(out, h, rid, left_out)
    return left_out


def _copy_quarantined(out: Path, h: HostOutput, rid: str, left_out: list[str]) -> None:
    """Copy one quarantined sample's reasons of host `h` (a line in `left_out` when it is refused)."""
    try:
        files = {
            name: _quarantine_file(h.path, rid, name)
            for name in (QUARANTINE_REASON, QUARANTINE_SOURCE, QUARANTINE_RECORD)
        }
    except NotADirectoryError:  # a plain file there: no quarantined sample
        return
    except UnsafePath as exc:
        left_out.append(f"host {h.name}: quarantine/{rid} was not copied: {exc}")
        return
    if files[QUARANTINE_REASON] is None:
        return
    dst = default_quarantine_dir(out) / rid
    for name, data in files.items():
        if data is not None:
            write_if_changed(dst / name, data)
    write_if_changed(dst / QUARANTINE_HOST, _json_bytes({"host": h.name, "path": str(h.path / rid)}))


def _quarantine_file(host: Path, rid: str, name: str) -> bytes | None:
    """The bytes of a host's quarantine file (None when it has none), read as hsextract.contained reads."""
    try:
        return read_regular(host, f"{QUARANTINE_DIR}/{rid}/{name}")
    except FileNotFoundError:
        return None


def write_fleet_client_files(out: Path, lines: int, final: bool, hosts: dict[str, list[list[int]]]) -> None:
    """The fleet's lines as one shard, as a client would record them: a summary once final, a
    status before (with only these keys: a collected set has no client's counters)."""
    if final:
        write_client_summary(
            client_summary_path(out),
            ClientSummary(state="done", dataset_lines=lines, shard=WHOLE, collected_from=hosts),
            if_changed=True,
        )
        drop = client_status_path(out)
    else:
        write_client_status(
            client_status_path(out),
            ClientStatus(
                state="collecting",
                dataset_lines=lines,
                shard=WHOLE,
                collected_from=hosts,
                absent=frozenset(ClientStatus.NULLABLE),
            ),
            if_changed=True,
        )
        drop = client_summary_path(out)
    if drop.exists():
        drop.unlink()


def _read_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8") as f:
        for line in f:
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if isinstance(obj, dict):
                    out.append(obj)
    return out
