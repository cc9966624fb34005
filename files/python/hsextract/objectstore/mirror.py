"""The dataset-level files of a set in a bucket: written in the work directory, then published.

The formats' finalize writes its files (speculators' Arrow dataset, sample_lengths.json, the draft
vocabulary's and config files) into the work directory, as into an output directory. This module
then uploads those that changed since the last publish, in an order that keeps the bucket
readable at every instant: the new files first, ``state.json`` (the Arrow dataset's switch) after
them, ``.hsextract/finalized.json`` (how many samples the files cover) last; only then are the
files the new ones replaced removed from the bucket. What was published is recorded in
``.hsextract/objectstore-published.json`` (sizes, times, ETags), so a restart publishes only
what changed.

What is published beside them: the client's summary, rejects and failures, the dataset record
and the vocabulary checkpoint (``.hsextract/``), so `hsextract collect` can do a bucket's
accounts and merge its vocabulary without the host; and, of a collected set, the samples its
collect failed (``collect-failures.jsonl``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hsextract.durable import atomic_write_bytes
from hsextract.objectstore.store import ObjectStore
from hsextract.output.layout import (
    CLIENT_SUMMARY,
    COLLECT_FAILURES,
    DATASET_RECORD,
    FAILURES,
    FINALIZED,
    MANIFEST_ENTRIES,
    MANIFEST_HEADER,
    QUARANTINE_DIR,
    REGEN_OUTPUT,
    REJECTS,
    RUN_FILE,
    STATE_DIR,
    VOCAB_CHECKPOINT,
    client_file_shard,
    state_dir,
)

PUBLISHED = "objectstore-published.json"
LAST = ("state.json", f"{STATE_DIR}/{FINALIZED}")  # published after every other file, in this order


def _published_state(work: Path) -> dict[str, list]:
    try:
        data = json.loads((state_dir(work) / PUBLISHED).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def dataset_files(work: Path) -> list[str]:
    """The paths (relative to `work`) that belong in the bucket beside the samples."""
    skip_top = {MANIFEST_ENTRIES, MANIFEST_HEADER, RUN_FILE, REGEN_OUTPUT, QUARANTINE_DIR, STATE_DIR}
    out: list[str] = []
    for root, dirs, files in os.walk(work):
        rel_root = Path(root).relative_to(work)
        if rel_root == Path("."):
            dirs[:] = [d for d in dirs if d not in skip_top]
        for name in files:
            rel = str(rel_root / name) if rel_root != Path(".") else name
            if rel_root == Path(".") and name in skip_top:
                continue
            if name.startswith("."):
                continue
            out.append(rel)
    keep = {FINALIZED, DATASET_RECORD, VOCAB_CHECKPOINT, COLLECT_FAILURES}
    for name in sorted(os.listdir(state_dir(work))) if state_dir(work).is_dir() else []:
        if name in keep or any(client_file_shard(name, b) for b in (CLIENT_SUMMARY, REJECTS, FAILURES)):
            out.append(f"{STATE_DIR}/{name}")
    return sorted(out, key=lambda r: (LAST.index(r) + 1 if r in LAST else 0, r))


def publish_dataset_files(store: ObjectStore, work: Path) -> list[str]:
    """Upload the dataset-level files that changed, then remove those the work directory no
    longer has; the paths uploaded."""
    before = _published_state(work)
    now: dict[str, list] = {}
    sent: list[str] = []
    for rel in dataset_files(work):
        p = work / rel
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        stamp = [st.st_size, st.st_mtime_ns]
        if before.get(rel, [None, None])[:2] == stamp:
            now[rel] = before[rel]
            continue
        etag = store.put_file(store.url.key(rel), p, st.st_size, create_only=False)
        now[rel] = [*stamp, etag]
        sent.append(rel)
    for rel in sorted(set(before) - set(now)):
        store.delete(store.url.key(rel))
    if sent or set(before) != set(now):
        atomic_write_bytes(state_dir(work) / PUBLISHED, (json.dumps(now, indent=1, sort_keys=True) + "\n").encode())
    return sent
