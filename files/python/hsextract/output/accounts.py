"""Every sample of a run accounted for: the counts that must add up, and the files they come from.

A run's promise is that nothing is lost without a word. Its counts make that checkable:

* dataset lines (of this host's shard) = accepted + rejected (rejects.jsonl, with reasons);
* accepted = in the training set (manifest.jsonl) + failed (failures.jsonl, with reasons)
  + quarantined (quarantine/<rid>/reason.txt) + still on their way (staged or in flight).

Once the client has finished and the drain has caught up, nothing is on its way, and an
accepted sample found in none of the three places is *unaccounted*: a bug, reported with its
dataset index. A run also fails its check when failures or quarantines exceed a share of the
accepted samples (default 1 %): the data is then not what the user asked for, even if every
sample is explained. A sample is counted once, in the first place it is found, in the order
above (a sample quarantined once and then written by a resend counts as written).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hsextract.output.client_files import all_finished, read_shards
from hsextract.output.layout import (
    FAILURES,
    QUARANTINE_DIR,
    QUARANTINE_REASON,
    REJECTS,
    client_files,
    default_quarantine_dir,
    run_file_path,
)
from hsextract.output.run_files import ClientSummary, read_json_object
from hsextract.shard import Shard
from hsextract.staging.records import parse_rid

DEFAULT_MAX_FAILURE_SHARE = 0.01


@dataclass(frozen=True)
class Accounts:
    """Where every sample of a shard is; see the module docstring."""

    lines: int  # dataset lines of this shard
    rejected: dict[str, int]
    in_set: int
    failed: dict[str, int]
    quarantined: dict[str, int]
    on_the_way: int  # staged or in flight (0 once the run is final)
    unaccounted: list[int] = field(default_factory=list)  # dataset indices, only when final
    final: bool = False

    @property
    def accepted(self) -> int:
        return self.lines - sum(self.rejected.values())

    def failed_share(self) -> float:
        return sum(self.failed.values()) / self.accepted if self.accepted else 0.0

    def quarantined_share(self) -> float:
        return sum(self.quarantined.values()) / self.accepted if self.accepted else 0.0

    def problems(self, max_share: float = DEFAULT_MAX_FAILURE_SHARE) -> list[str]:
        """What is wrong with a final run, each with its numbers; empty when the run is sound."""
        if not self.final:
            return []
        out = []
        if self.unaccounted:
            shown = ", ".join(map(str, self.unaccounted[:10])) + (" ..." if len(self.unaccounted) > 10 else "")
            out.append(
                f"{len(self.unaccounted)} accepted sample(s) are in neither the training set, the failures "
                f"nor the quarantine (dataset indices {shown}): this is a bug, please report it"
            )
        for what, counts, share, where in (
            ("failed", self.failed, self.failed_share(), FAILURES),
            ("quarantined", self.quarantined, self.quarantined_share(), f"{QUARANTINE_DIR}/"),
        ):
            if share > max_share:
                reasons = ", ".join(f"{r} {n}" for r, n in sorted(counts.items()))
                out.append(
                    f"{sum(counts.values())} of {self.accepted} accepted samples {what} ({share:.1%}, more "
                    f"than the allowed {max_share:.1%}): {reasons}; see {where}"
                )
        return out

    def lines_of_text(self) -> list[str]:
        """The reconciliation in words, one fact a line."""
        rej = sum(self.rejected.values())
        out = [
            f"{self.lines} dataset lines = {self.accepted} accepted + {rej} rejected",
            f"{self.accepted} accepted = {self.in_set} in the set + {sum(self.failed.values())} failed + "
            f"{sum(self.quarantined.values())} quarantined"
            + (f" + {self.on_the_way} on the way" if self.on_the_way else "")
            + (f" + {len(self.unaccounted)} UNACCOUNTED" if self.unaccounted else ""),
        ]
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "lines": self.lines,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "in_set": self.in_set,
            "failed": self.failed,
            "quarantined": self.quarantined,
            "on_the_way": self.on_the_way,
            "unaccounted": self.unaccounted,
            "final": self.final,
        }


def reconcile(
    shard: Iterable[int],
    rejected: dict[int, str],
    in_set: set[int],
    failed: dict[int, str],
    quarantined: dict[int, str],
    on_the_way: set[int],
    final: bool,
) -> Accounts:
    """Place every index of the shard in exactly one bucket (the first that holds it)."""
    lines = 0
    rej: Counter[str] = Counter()
    fail: Counter[str] = Counter()
    quar: Counter[str] = Counter()
    n_set = n_way = 0
    missing: list[int] = []
    for i in shard:
        lines += 1
        if i in rejected:
            rej[rejected[i]] += 1
        elif i in in_set:
            n_set += 1
        elif i in failed:
            fail[failed[i]] += 1
        elif i in quarantined:
            quar[quarantined[i]] += 1
        elif i in on_the_way or not final:
            n_way += 1
        else:
            missing.append(i)
    return Accounts(lines, dict(rej), n_set, dict(fail), dict(quar), n_way, missing, final)


# -- the files -------------------------------------------------------------------------------------


def read_indexed_jsonl(path: Path) -> dict[int, str]:
    """index -> reason of a rejects or failures file (a torn or foreign line is skipped)."""
    out: dict[int, str] = {}
    try:
        f = path.open(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return out
    with f:
        for line in f:
            try:
                obj = json.loads(line)
                out[int(obj["index"])] = str(obj.get("reason", "?"))
            except (ValueError, KeyError, TypeError):
                continue
    return out


def quarantined_indices(quarantine: Path, run_id: str) -> dict[int, str]:
    """index -> reason of this run's quarantined dumps (``<rid>`` or ``<rid>.<n>`` directories)."""
    out: dict[int, str] = {}
    try:
        entries = list(quarantine.iterdir())
    except FileNotFoundError:
        return out
    for d in entries:
        if d.name.startswith("."):
            continue
        m = re.match(r"^(.*)\.\d+$", d.name)  # a later quarantine of the same rid: <rid>.<n>
        p = parse_rid(m[1] if m else d.name)
        if p is None or p.probe or p.run_id != run_id:
            continue
        try:
            reason = (d / QUARANTINE_REASON).read_text().splitlines()[0].strip()
        except (OSError, IndexError):
            reason = "?"
        out[p.index] = reason
    return out


def read_accounts(
    output: Path, quarantine: Path | None = None, on_the_way: Iterable[int] = (), final: bool | None = None
) -> Accounts | None:
    """The accounts of the run written to `output`, from its files; None before every client has
    said how large its shard is (its summary). Several clients of disjoint shards are counted
    together (hsextract.output.client_files). ``final`` defaults to "every client has finished"; the
    caller knows whether anything is still staged (``on_the_way``)."""
    from hsextract.output.manifest import iter_entries

    shards = read_shards(output)
    lines = [(s.summary or s.status or ClientSummary()).dataset_lines for s in shards]
    run = read_json_object(run_file_path(output))
    if not lines or not run or any(n is None for n in lines):
        return None
    in_set = {e.dataset_index for e in iter_entries(output)}
    return reconcile(
        _shard_indices([(s.shard, n) for s, n in zip(shards, lines, strict=True) if n is not None]),
        rejected=_read_all(output, REJECTS),
        in_set=in_set,
        failed=_read_all(output, FAILURES),
        quarantined=quarantined_indices(quarantine or default_quarantine_dir(output), str(run.get("run_id", ""))),
        on_the_way=set(on_the_way),
        final=all_finished(shards) if final is None else final,
    )


def _shard_indices(shards: list[tuple[Shard, int]]) -> Iterable[int]:
    """The dataset indices of the clients' shards ((shard, dataset lines)), in order, each once."""
    ranges = [shard.indices(lines) for shard, lines in shards]
    if len(ranges) == 1:
        return ranges[0]
    return sorted(set().union(*ranges))


def _read_all(output: Path, base: str) -> dict[int, str]:
    """index -> reason over every client's rejects (or failures) file."""
    out: dict[int, str] = {}
    for path in client_files(output, base).values():
        out.update(read_indexed_jsonl(path))
    return out
