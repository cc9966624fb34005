"""The object ``hsextract status --json`` prints, typed: a drain's run, or a set made by collect.

`hsextract.status` writes it for a run and `hsextract.status_collected` for a collected set; the
fleet's status reads it from every host (hsextract.fleet.status_input checks it,
hsextract.fleet.status reads it). One record with one `to_json`, so its keys are spelled once and
keep the order and values they had as inline dicts: a run's object ends in ``commits`` (the
drain's commit timeline, hsextract.output.commit_timeline) and ``dataset_files``; a collected
set's, which has no drain (``drain`` and ``client`` null) and whose dataset-level files collect
writes itself, ends in ``collected`` (`CollectedStatus`) instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hsextract.collect.report_file import CollectReport
    from hsextract.output.accounts import Accounts
    from hsextract.output.commit_timeline import CommitTimeline
    from hsextract.output.run_files import DrainStatus


@dataclass(frozen=True)
class CollectedStatus:
    """A collected set's part of the object: its manifest's totals and what its last collect found."""

    samples: int  # in the set (its manifest)
    tokens: int
    bytes: int
    report: CollectReport  # the last collect's (hsextract.collect.report_file)
    precision: str = "bf16"  # how the set stores its rows (its manifest header's)

    def to_json(self) -> dict[str, Any]:
        r = self.report
        return {
            "final": r.final,
            "precision": self.precision,
            "samples": self.samples,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "hosts": {name: h.to_json() for name, h in r.hosts.items()},
            "refused": list(r.refused),
            "missing_shards": list(r.missing_shards),
            "doubled_shards": list(r.doubled_shards),
            "failed_verification": len(r.failed_verification),  # the samples; the lines are in the report
        }


@dataclass(frozen=True)
class StatusReport:
    """A run's or a collected set's status, as ``hsextract status`` judged it."""

    ok: bool  # the exit status's verdict: the drain (where there is one) is healthy and nothing is a problem
    why: str  # the drain's health, in words
    problems: list[str]
    drain: DrainStatus | None  # None: no drain status file
    client: dict[str, Any] | None  # every client's status as one (hsextract.output.client_files.combined_status)
    # The dataset's size as the finished clients counted it (a fleet's hosts sum their shards to it);
    # None until they have, or when they disagree.
    dataset_lines: int | None
    accounts: Accounts | None  # the run's reconciliation; None before every client gave its shard's size
    # (samples the dataset-level files cover, samples in the set); None where the drain does not say.
    dataset_files: tuple[int, int] | None
    collected: CollectedStatus | None = None  # only for a collected set, which has no dataset_files
    commits: CommitTimeline | None = None  # a run's: when its samples were committed, against the client's end

    def __post_init__(self) -> None:
        if self.collected is not None and (self.dataset_files is not None or self.commits is not None):
            raise ValueError("a collected set's status has no dataset_files or commits: its object has no key for them")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": self.ok,
            "why": self.why,
            "problems": list(self.problems),
            "drain": self.drain.to_json() if self.drain else None,
            "client": self.client,
            "dataset_lines": self.dataset_lines,
            "accounts": self.accounts.as_dict() if self.accounts else None,
        }
        if self.collected is not None:
            out["collected"] = self.collected.to_json()
            return out
        out["commits"] = self.commits.to_json() if self.commits is not None else None
        files = self.dataset_files
        out["dataset_files"] = (
            None if files is None else {"samples": files[0], "of": files[1], "current": files[0] == files[1]}
        )
        return out
