"""The collect report, typed: ``.hsextract/collect-report.json``, the last collect's findings.

One record (`CollectReport`) with one writer (`write_collect_report`, called by
hsextract.collect.report at the end of every collect whose hosts have a sample) and one reader
(`read_collect_report`: ``hsextract status`` takes a set that has the file and no drain's status for
a collected set, and prints from it: hsextract.status_collected). So every key is
spelled once, here.

The file is the JSON of `CollectReport.to_json` with sorted keys, indented by one, as the dict
before the record was written: the same keys, values and bytes, and ``from_json(r.to_json()) == r``.
Sorted keys also mean a reader sees the hosts by name, each host's keys in alphabetical order, which
``hsextract status --json`` prints as they are (so `CollectedHost`'s fields are in that order).

`from_json` reads what any version wrote: a key the file lacks is read as its empty value (no host,
nothing refused or missing, not final, no samples), as the status's readers took a missing key
before. A shard that is not ``[i, n]`` or ``"i/n"`` is a ConfigError. Nothing here imports torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.output.layout import collect_report_path
from hsextract.output.run_files import read_json_object
from hsextract.shard import Shard


@dataclass(frozen=True)
class CollectedHost:
    """One admitted host output, as the collect found it; the fields in the file's (sorted) order."""

    collected: int  # of its samples, in the collected set
    finished: bool  # its clients and its drain are done with its shards
    path: str  # the host output collect read (after the play's pull, a local copy)
    samples_in_host: int  # in its manifest
    shards: list[Shard]  # its clients' shards

    def to_json(self) -> dict[str, Any]:
        return {
            "collected": self.collected,
            "finished": self.finished,
            "path": self.path,
            "samples_in_host": self.samples_in_host,
            "shards": [s.to_json() for s in self.shards],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CollectedHost:
        return cls(
            collected=data.get("collected") or 0,
            finished=bool(data.get("finished")),
            path=data.get("path") or "",
            samples_in_host=data.get("samples_in_host") or 0,
            shards=[Shard.from_json(s) for s in data.get("shards") or []],
        )


@dataclass(frozen=True)
class CollectReport:
    """What the last collect of a set found, with no time stamps (a collect that changes nothing
    leaves the file as it was)."""

    into: str  # the collected set
    final: bool  # every shard of the dataset once, from hosts that have all finished
    samples: int  # in the set
    hosts: dict[str, CollectedHost]  # by name, as given
    refused: list[str]  # the host outputs not admitted, one line each, with why
    duplicates: list[str]  # samples left out as another host's copy, one line each
    # The failure journal's lines (hsextract.collect.failures) of the samples not in the set.
    failed_verification: list[dict[str, Any]]
    missing_shards: list[str]  # parts of the dataset in no host's shard (hsextract.collect.shards)
    doubled_shards: list[str]  # parts in two
    accounts: dict[str, Any]  # the fleet's reconciliation, as hsextract.output.accounts.Accounts.as_dict has it

    def to_json(self) -> dict[str, Any]:
        return {
            "into": self.into,
            "final": self.final,
            "samples": self.samples,
            "hosts": {name: h.to_json() for name, h in self.hosts.items()},
            "refused": list(self.refused),
            "duplicates": list(self.duplicates),
            "failed_verification": list(self.failed_verification),
            "missing_shards": list(self.missing_shards),
            "doubled_shards": list(self.doubled_shards),
            "accounts": self.accounts,
        }

    def to_bytes(self) -> bytes:
        """The file's bytes (see the module docstring)."""
        return (json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CollectReport:
        """The report of a file's object, of this version or an earlier one (see the module docstring)."""
        return cls(
            into=data.get("into") or "",
            final=bool(data.get("final")),
            samples=data.get("samples") or 0,
            hosts={name: CollectedHost.from_json(h) for name, h in (data.get("hosts") or {}).items()},
            refused=list(data.get("refused") or []),
            duplicates=list(data.get("duplicates") or []),
            failed_verification=list(data.get("failed_verification") or []),
            missing_shards=list(data.get("missing_shards") or []),
            doubled_shards=list(data.get("doubled_shards") or []),
            accounts=dict(data.get("accounts") or {}),
        )


def read_collect_report(output: str | Path) -> CollectReport | None:
    """The last collect's report of `output`, or None when `output` is not a collected set (no such
    file, or not a JSON object)."""
    data = read_json_object(collect_report_path(output))
    return None if data is None else CollectReport.from_json(data)


def write_collect_report(output: str | Path, report: CollectReport) -> bool:
    """Write `report` as `output`'s, atomically and durably, unless the file holds its bytes already
    (a collect repeated changes nothing). Whether it was written."""
    from hsextract.collect.bookkeeping import write_if_changed  # the collect's; status reads only

    return write_if_changed(collect_report_path(output), report.to_bytes())
