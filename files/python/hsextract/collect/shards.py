"""Do the hosts' shards cover the dataset exactly once?

Each client of a fleet run takes the samples whose dataset index x has x % n == i (its shard
i/n, the client's ``--shard``). The hosts' outputs together are the whole dataset when every
index below the dataset's size lies in exactly one shard: no shard missing (a host not collected,
or not run), none twice (two hosts given the same shard, or the same output given twice).

Membership repeats with period L, the least common multiple of the shards' n, so it is decided
on the indices below min(L, dataset lines); a fleet with one n has L = n.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hsextract.shard import Shard

# Past this many residues the check looks at the first ones only (fleets use one n in practice).
_MAX_RESIDUES = 1 << 20


@dataclass
class Coverage:
    """Where the shards leave the dataset uncovered or covered twice."""

    missing: list[str] = field(default_factory=list)  # one line each
    doubled: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.missing and not self.doubled


def shard_indices(shards: Sequence[Shard], lines: int) -> list[int]:
    """Every dataset index below `lines` that lies in one of `shards`, ascending, each once."""
    return sorted({x for s in shards for x in s.indices(lines)})


def check_coverage(shards: Mapping[str, Sequence[Shard]], lines: int) -> Coverage:
    """The missing and doubled parts of the dataset, given each host's shards (host -> shards)."""
    owners = [(host, s) for host, ss in shards.items() for s in ss]
    cov = Coverage()
    if lines <= 0:
        return cov
    period = math.lcm(*(s.count for _, s in owners)) if owners else 1
    span = min(period, lines, _MAX_RESIDUES)
    holders: list[list[str]] = [[] for _ in range(span)]
    for host, s in owners:
        for x in s.indices(span):
            holders[x].append(f"{host} ({s})")
    ns = {s.count for _, s in owners}
    missing = [x for x in range(span) if not holders[x]]
    if missing:
        if len(ns) == 1:
            (n,) = ns
            for i in sorted({x % n for x in missing}):
                cov.missing.append(f"shard {i}/{n} is in no host output (dataset indices {_some(i, n, lines)})")
        else:
            cov.missing.append(f"dataset indices {_list(missing)} (and each {period} later) are in no host's shard")
    for x in range(span):
        if len(holders[x]) > 1:
            cov.doubled.append(
                f"dataset index {x} (and each {period} later) is in the shards of {' and '.join(holders[x])}"
            )
            if len(cov.doubled) >= 5:
                break
    return cov


def _some(i: int, n: int, lines: int) -> str:
    first = list(range(i, min(lines, i + 4 * n), n))
    return ", ".join(map(str, first)) + (" ..." if i + 4 * n < lines else "")


def _list(xs: list[int]) -> str:
    return ", ".join(map(str, xs[:8])) + (" ..." if len(xs) > 8 else "")
