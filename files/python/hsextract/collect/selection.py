"""What a collect copies, and the numbers the collected samples get: decided from manifests alone.

A sample is identified across the fleet by its dataset index (the shards are disjoint, so each
index has one host). A host's entry is

* already collected when the collected manifest holds its dataset index from the same host and
  host index: a second collect skips it, so it never changes what is there;
* a duplicate when the index was collected from another host, or another host given in this
  collect has it too (overlapping shards): the first stays, the other is reported;
* pending otherwise: fetched, verified, then numbered.

Pending samples go in dataset-index order, so a collect killed at any instant and run again
numbers every sample as an uninterrupted one would. Output indices continue the collected
set's (0, 1, 2... in the order samples are committed): speculators' ``hs_{i}`` is Arrow row i,
and a host that grew between two collects adds its new samples at the end. Sample files hold no
output index (ModelOpt's ``conversation_id`` is the dataset index, unique across hosts because
the shards are), so a file is renumbered by its name alone, its bytes and checksum unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hsextract.output.manifest import ManifestEntry


@dataclass(frozen=True)
class Pending:
    """One host sample to fetch: its host and its entry in the host's manifest."""

    host: str
    entry: ManifestEntry


@dataclass
class Selection:
    """What this collect fetches, what it skips as already there, and the duplicates it reports."""

    pending: list[Pending] = field(default_factory=list)
    already: list[Pending] = field(default_factory=list)  # host samples already in the collected set
    duplicates: list[str] = field(default_factory=list)  # one line each

    def bytes_to_fetch(self, start: int = 0) -> int:
        return sum(p.entry.bytes for p in self.pending[start:])


def select_entries(collected: Iterable[ManifestEntry], hosts: Mapping[str, Sequence[ManifestEntry]]) -> Selection:
    """The samples of `hosts` (name -> manifest entries, in the order the hosts were given) that
    the collected set lacks, in dataset-index order; see the module docstring."""
    have = {e.dataset_index: e for e in collected}
    plan = Selection()
    chosen: dict[int, str] = {}
    for host, entries in hosts.items():
        for e in entries:
            got = have.get(e.dataset_index)
            origin = (got.host, got.host_index) if got else None
            # The same sample, maybe under another host name (the same output given another name).
            same = got is not None and got.host_index == e.output_index and got.checksum == e.checksum
            if same or origin == (host, e.output_index):
                plan.already.append(Pending(host, e))
            elif origin is not None:
                plan.duplicates.append(
                    f"host {host} sample {e.output_index} (dataset index {e.dataset_index}) is already collected "
                    f"from host {origin[0]} (its sample {origin[1]}): left out"
                )
            elif e.dataset_index in chosen:
                plan.duplicates.append(
                    f"host {host} sample {e.output_index} (dataset index {e.dataset_index}) is also in host "
                    f"{chosen[e.dataset_index]}: left out (their shards overlap)"
                )
            else:
                chosen[e.dataset_index] = host
                plan.pending.append(Pending(host, e))
    plan.pending.sort(key=lambda p: p.entry.dataset_index)
    return plan


def collected_entry(
    p: Pending, output_index: int, relative_path: str, converted: ManifestEntry | None = None
) -> ManifestEntry:
    """The collected set's entry for a host sample committed as `output_index` at `relative_path`:
    the host's entry (tokens, bytes, checksum, fingerprint, when it was written), or the entry of its
    file `converted` to bf16 (its bytes, checksum and fingerprint: hsextract.formats.to_bf16), with its
    new number and name, and where it came from."""
    base = converted if converted is not None else p.entry
    return replace(base, output_index=output_index, file=relative_path, host=p.host, host_index=p.entry.output_index)
