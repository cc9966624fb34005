"""The collected set's draft vocabulary: the hosts' token counts summed, then every trainer's files.

Each host's drain keeps the loss-masked token counts of its samples in a checkpoint that covers
the first `covered` entries of its manifest (hsextract.vocab.checkpoint). The counts of the
collected set are, host by host, that checkpoint's when the collected samples of the host are
exactly its checkpointed ones plus later ones (recounted from their collected files), and a
recount of the host's collected files otherwise (no checkpoint, a sample that failed
verification, a host not given this time). So the union equals a recount of the collected set,
while reading little more than the samples the hosts' checkpoints do not cover yet.

The files are then written by the drain's own code (`VocabTracker.write_files`), with the
collected set's checkpoint beside them, so ``hsextract finalize --verify`` checks them as it
checks a drain's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from hsextract.collect.hosts import HostOutput
from hsextract.output.manifest import ManifestEntry
from hsextract.vocab.checkpoint import entry_identity, read_checkpoint
from hsextract.vocab.counts import TokenCounts
from hsextract.vocab.tracker import VocabTracker, recount


def union_counts(out: Path, fmt, entries: Sequence[ManifestEntry], hosts: Sequence[HostOutput]) -> TokenCounts:
    """The loss-masked token counts of the collected set's `entries` (see the module docstring)."""
    by_host: dict[str, list[ManifestEntry]] = defaultdict(list)
    for e in entries:
        by_host[e.host].append(e)
    given = {h.name: h for h in hosts}
    total = TokenCounts()
    for name, collected in by_host.items():
        rest = collected
        h = given.get(name)
        if h is not None:
            cp, _ = read_checkpoint(h.path)
            if cp is not None and cp.matches(h.entries):
                mine = {e.host_index for e in collected}
                if all(i in mine for i in range(cp.covered)):
                    total.merge(cp.counts)
                    rest = [e for e in collected if e.host_index >= cp.covered]
        total.merge(recount(out, fmt, rest))
    return total


def write_vocab(
    out: Path, fmt, entries: Sequence[ManifestEntry], hosts: Sequence[HostOutput], sizes: Sequence[int], vocab_size: int
) -> list[Path]:
    """Every trainer's draft-vocabulary files for the collected set, and its counts checkpoint."""
    tracker = VocabTracker(out, fmt, sizes, checkpoint_interval_s=0.0)
    tracker.counts = union_counts(out, fmt, entries, hosts)
    tracker.covered = len(entries)
    tracker.last = entry_identity(entries[-1]) if entries else None
    return tracker.write_files(vocab_size)
