"""The collected set's dataset-level files: the format's own, the draft vocabulary, SpecForge's order.

They are rebuilt by the same code the drain uses (the format's ``finalize``: speculators' Arrow
dataset brought up to the manifest, speculators v1's ``sample_lengths.json``; the drain's
vocabulary writer), and only when the collected manifest changed since the last time: the key
of what they were built from is kept in ``.hsextract/collect-state.json``, so a collect that
adds nothing writes nothing.

SpecForge numbers samples by their position in its sorted list of paths (``sample_id``
``<run>:<position>``), and its reader sorts paths as strings: ``data_10.ckpt`` before
``data_2.ckpt``. No numbering that grows by appending can make that order the output index's,
so ``reader_order.json`` lists, position by position, the sample the reader gets there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hsextract.collect.hosts import HostOutput
from hsextract.collect.vocab import write_vocab
from hsextract.durable import atomic_write_bytes, atomic_write_json
from hsextract.output.layout import READER_ORDER, collect_state_path
from hsextract.output.manifest import ManifestEntry, ManifestHeader
from hsextract.output.run_files import read_json_object
from hsextract.vocab.checkpoint import entry_identity

SPECFORGE_READER = "SpecForge 0.2.0 OfflineManifestReader: os.walk for *.ckpt, absolute paths sorted as strings"


def reader_order(entries: Sequence[ManifestEntry]) -> list[ManifestEntry]:
    """The entries in the order SpecForge's offline reader lists their files (their common prefix
    aside, absolute paths sort as the relative ones do)."""
    return sorted(entries, key=lambda e: e.file)


def finalize_collected(
    out: Path,
    fmt,
    header: ManifestHeader,
    entries: Sequence[ManifestEntry],
    hosts: Sequence[HostOutput],
    sizes: Sequence[int] | None,
    vocab_size: int,
) -> bool:
    """Rebuild the dataset-level files if the manifest changed since they were built (`sizes`
    None: no draft vocabulary); return whether anything was written."""
    key: dict[str, Any] = {
        "entries": len(entries),
        "last": entry_identity(entries[-1]) if entries else None,
        "sizes": list(sizes) if sizes is not None else None,
        "vocab_size": vocab_size,
    }
    state = read_json_object(collect_state_path(out)) or {}
    if state.get("finalized") == key:
        return False
    fmt.finalize(out, header, list(entries))
    if sizes is not None:
        write_vocab(out, fmt, entries, hosts, sizes, vocab_size)
    if fmt.name == "specforge":
        order = [[e.output_index, e.dataset_index, e.host, e.host_index] for e in reader_order(entries)]
        body = {
            "reader": SPECFORGE_READER,
            "columns": ["output_index", "dataset_index", "host", "host_index"],
            "order": order,
        }
        atomic_write_bytes(out / READER_ORDER, (json.dumps(body, separators=(",", ":")) + "\n").encode())
    atomic_write_json(collect_state_path(out), {"finalized": key})
    return True
