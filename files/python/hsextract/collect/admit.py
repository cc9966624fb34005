"""Which host outputs a collect takes: the reference they are held to, and a refusal line for each other.

A refused host output gives nothing to the collected set this time, and is named in one line
with the field, the value expected and the value found (`hsextract.collect.identity`). Besides
identity, a host is refused

* under ``--final``, while its client has not finished or its drain has not caught up with it
  (accepted samples in neither its set, its failures nor its quarantine): a final collect is the
  last, so it must see every host's last sample. A drain daemon that idles after the run is no
  reason: it has nothing left to write;
* under ``--move``, while a drain runs on it: the drain re-reads committed files (the Arrow
  dataset, the vocabulary recount), so they may not be taken from under it.

Without ``--final`` a host that is still being extracted is collected as far as it is committed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hsextract.collect.hosts import HostOutput
from hsextract.collect.identity import Difference, dataset_difference, header_differences, lines_difference
from hsextract.output.manifest import ManifestHeader

# A header as the collect writes its host's rows (hsextract.collect.runner: --to-bf16 converts FP8 ones).
HeaderMap = Callable[[ManifestHeader], ManifestHeader]


def same_header(header: ManifestHeader) -> ManifestHeader:
    return header


@dataclass
class Reference:
    """What every host output is held to, and where it comes from (for the refusal's wording)."""

    header: ManifestHeader | None
    dataset: dict[str, Any] | None
    lines: int | None
    source: str  # "the collected set" or "host <name>"


@dataclass
class Admission:
    admitted: list[HostOutput] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # one line each


def choose_reference(
    collected_header: ManifestHeader | None,
    collected_dataset: dict[str, Any] | None,
    collected_lines: int | None,
    hosts: Sequence[HostOutput],
) -> Reference:
    """The collected set's own identity when it has one, else the first host output that has a
    header. The dataset's size is the collected set's record of it, else the first host's that has one."""
    lines = collected_lines
    if lines is None:
        lines = next((h.clients[0].dataset_lines for h in hosts if h.clients), None)
    first = next((h for h in hosts if h.header is not None), None)
    if collected_header is not None:
        dataset = collected_dataset if collected_dataset is not None else first.dataset if first else None
        return Reference(collected_header, dataset, lines, "the collected set")
    if first is None:
        return Reference(None, None, lines, "nothing")
    return Reference(first.header, first.dataset, lines, f"host {first.name}")


def differences(ref: Reference, h: HostOutput, as_collected: HeaderMap = same_header) -> list[Difference]:
    """How `h` differs from the reference in what makes samples interchangeable, each header taken
    as the collect writes its rows (`as_collected`: FP8 rows as bf16 ones, in the format they become,
    where the collect converts them)."""
    out = []
    if ref.header is not None and h.header is not None:
        out += header_differences(as_collected(ref.header), as_collected(h.header))
    if h.header is not None or h.dataset is not None:
        d = dataset_difference(ref.dataset, h.dataset)
        if d is not None:
            out.append(d)
    for c in h.clients:
        d = lines_difference(ref.lines, c.dataset_lines)
        if d is not None:
            out.append(d)
            break
    return out


def admit(
    hosts: Sequence[HostOutput], ref: Reference, *, final: bool, move: bool, as_collected: HeaderMap = same_header
) -> Admission:
    """Split `hosts` into those collected and those refused (see the module docstring)."""
    result = Admission()
    for h in hosts:
        diffs = differences(ref, h, as_collected)
        if diffs:
            what = "; ".join(d.describe() for d in diffs)
            hint = (
                " (`--to-bf16` writes FP8 rows as bf16 files)"
                if any(d.field == "precision" and d.actual == "fp8" for d in diffs)
                else ""
            )
            result.refused.append(
                f"host {h.name} ({h.path}) refused: {what} (as {ref.source} has it); "
                f"it is not of this training set, nothing of it was collected{hint}"
            )
        elif final and not h.finished:
            result.refused.append(f"host {h.name} ({h.path}) refused for --final: {_unfinished(h)}")
        elif move and h.drain_busy:
            result.refused.append(
                f"host {h.name} ({h.path}) refused for --move: a drain runs on it "
                f"({h.drain_busy}); stop it first, then collect again"
            )
        else:
            result.admitted.append(h)
    return result


def _unfinished(h: HostOutput) -> str:
    if not h.clients_finished:
        return (
            "its client has not finished (no client summary in .hsextract/); finish its extraction, then collect again"
        )
    shown = ", ".join(map(str, h.behind[:8])) + (" ..." if len(h.behind) > 8 else "")
    drain = (
        f"its drain is at it ({h.drain_busy}): wait for it"
        if h.drain_busy
        else "no drain runs on it: start its drain (hsextract drain, or its service)"
    )
    return (
        f"its drain has not caught up: {len(h.behind)} accepted sample(s) (dataset indices {shown}) are in "
        f"neither its set, its failures nor its quarantine; {drain}, then collect again"
    )
