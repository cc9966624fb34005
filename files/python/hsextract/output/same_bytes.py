"""Rows of one set whose files have the same bytes: what a consistent lie in a manifest leaves.

Every check of a row against its file (size, checksum, token count, fingerprint:
hsextract.formats.sample_check) passes when the row was edited to name another sample's file
copied under its own name, with that sample's size, checksum, token count and fingerprint. Two
samples of one set are different prompts, so their files differ; two rows with one checksum mean
that one of them holds another sample's file (or that the dataset gives one conversation twice),
and nothing in the set tells which row is the true one. ``finalize --verify`` flags every row of
such a group, and ``collect`` collects none of a group's rows it has not collected already.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from hsextract.output.manifest import ManifestEntry


def same_bytes(entries: Iterable[ManifestEntry]) -> dict[int, list[ManifestEntry]]:
    """id(row) -> the other rows whose checksum is the row's, for every row that shares its checksum
    with a row of another dataset index (the same index twice is a duplicate, not this)."""
    by_checksum: dict[str, list[ManifestEntry]] = defaultdict(list)
    for e in entries:
        by_checksum[e.checksum].append(e)
    out: dict[int, list[ManifestEntry]] = {}
    for group in by_checksum.values():
        if len({e.dataset_index for e in group}) < 2:
            continue
        for e in group:
            out[id(e)] = [o for o in group if o.dataset_index != e.dataset_index]
    return out


def describe(others: list[str], checksum: str) -> str:
    """The sentence of a row whose file has the bytes of the rows named `others`."""
    named = ", ".join(others[:3]) + (" ..." if len(others) > 3 else "")
    return (
        f"its file has the same bytes ({checksum}) as that of {named}: one of them holds another sample's file "
        "(or the dataset gives one conversation twice), and nothing tells which"
    )


def row_name(e: ManifestEntry) -> str:
    """A row of a set, as `describe` names it."""
    where = f"host {e.host} sample {e.host_index}, " if e.host else ""
    return f"{where}sample {e.output_index} (dataset index {e.dataset_index}, {e.rid})"


def host_row_name(host: str, e: ManifestEntry) -> str:
    """Row `e` of host `host`'s set, as `describe` names it."""
    return f"host {host} sample {e.output_index} (dataset index {e.dataset_index}, {e.rid})"
