"""Every sample of the fleet accounted for: each host's own reconciliation, and the fleet's.

Each host output reconciles its shard by itself (hsextract.output.accounts: its lines = accepted +
rejected; accepted = in its set + failed + quarantined). Over the fleet the same identity must
hold with the collected set in place of the hosts' sets::

    dataset lines (of the hosts' shards) = accepted + rejected          (every host's rejects)
    accepted = collected + failed + quarantined                          (failed: the hosts' failures
                                                                          and samples that failed
                                                                          verification at collect)

The fleet's is computed with the same `reconcile` over the union of the hosts' shards, from the
collected manifest and the hosts' files; the hosts' own accounts, summed, must give the same
lines and accepted counts, or something was counted twice or lost between them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hsextract.collect.hosts import HostOutput
from hsextract.collect.shards import shard_indices
from hsextract.output.accounts import Accounts, quarantined_indices, read_accounts, read_indexed_jsonl, reconcile
from hsextract.output.layout import FAILURES, REJECTS, default_quarantine_dir, state_dir


@dataclass
class FleetAccounts:
    per_host: dict[str, Accounts | None]
    fleet: Accounts
    problems: list[str] = field(default_factory=list)

    def lines_of_text(self, collected_from: dict[str, int], failed_from: dict[str, int]) -> list[str]:
        out = []
        for host, acc in self.per_host.items():
            if acc is None:
                out.append(f"host {host}: no client summary or status yet, its shard is unknown")
                continue
            out += [f"host {host}: {line}" for line in acc.lines_of_text()]
            out.append(
                f"host {host}: {acc.in_set} in its set = {collected_from.get(host, 0)} collected + "
                f"{failed_from.get(host, 0)} failed verification + "
                f"{acc.in_set - collected_from.get(host, 0) - failed_from.get(host, 0)} not fetched yet"
            )
        out += [f"fleet: {line}" for line in self.fleet.lines_of_text()]
        return out


def indexed_files(out: Path, base: str) -> dict[int, str]:
    """index -> reason over every file of kind `base` (``rejects.jsonl``...) of an output: one per
    shard where clients of several shards share it."""
    stem, _, ext = base.rpartition(".")
    merged: dict[int, str] = {}
    for p in sorted(state_dir(out).glob(f"{stem}*.{ext}")):
        merged.update(read_indexed_jsonl(p))
    return merged


def host_quarantine(h: HostOutput) -> dict[int, str]:
    run_id = h.header.run_id if h.header else ""
    return quarantined_indices(default_quarantine_dir(h.path), run_id) if run_id else {}


def fleet_accounts(
    hosts: Sequence[HostOutput], lines: int, collected: Iterable[int], collect_failed: dict[int, str], final: bool
) -> FleetAccounts:
    """The hosts' own accounts and the fleet's (see the module docstring)."""
    rejected: dict[int, str] = {}
    failed: dict[int, str] = {}
    quarantined: dict[int, str] = {}
    for h in hosts:
        rejected.update(indexed_files(h.path, REJECTS))
        failed.update(indexed_files(h.path, FAILURES))
        quarantined.update(host_quarantine(h))
    in_set = set(collected)
    failed.update({i: r for i, r in collect_failed.items() if i not in in_set})
    shards = [c.shard for h in hosts for c in h.clients]
    fleet = reconcile(shard_indices(shards, lines), rejected, in_set, failed, quarantined, set(), final)
    per_host = {h.name: read_accounts(h.path, final=h.finished) for h in hosts}
    result = FleetAccounts(per_host, fleet)
    known = [a for a in per_host.values() if a is not None]
    if len(known) == len(per_host):
        lines_sum, accepted_sum = sum(a.lines for a in known), sum(a.accepted for a in known)
        if (lines_sum, accepted_sum) != (fleet.lines, fleet.accepted):
            result.problems.append(
                f"the hosts' own accounts add up to {lines_sum} dataset lines and {accepted_sum} accepted, the "
                f"fleet's to {fleet.lines} and {fleet.accepted}: a host's files disagree with its shard"
            )
    result.problems += fleet.problems(max_share=1.0)
    return result
