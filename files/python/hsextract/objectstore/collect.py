"""``hsextract collect --into s3://bucket/run/set NAME=s3://bucket/run/NAME ...``: the hosts' sets
in one bucket merged in place, without a sample byte through the controller.

Each host's prefix is read from its own objects: its header, its manifest segments, its draft
vocabulary's published counts, and its orphans (objects no segment names), which are reported,
never collected. The hosts must share one configuration (format, dtype, hidden size, layers) and
one run id. Their samples are merged in dataset-index order (a dataset index two hosts both hold
is taken once, from the first, and reported), numbered from 0 as the trainers' readers want, and
each is **server-side copied** to its name in the collected set (``copy_object`` with
``If-None-Match: *``): the server moves the bytes, the controller sends one request per sample.
A copy is confirmed (its size and its manifest line as the server reports them) before the
segment that names it is published, as the drain does (hsextract.objectstore.committer); the
collected set's manifest segments carry each sample's host and index there.

Like a drain, a collect publishes an epoch segment first (one writer per prefix), and can be killed
and run again at any instant: samples already named are skipped, a copy made but never named is
replaced. Collecting again after the hosts wrote more adds what is new. The dataset-level files
are then rebuilt in a local work directory (the tokens read back with ranged reads, the draft
vocabulary the hosts' counts summed, hsextract.collect.vocab's rule) and published.

Verifying every byte is `hsextract finalize --output s3://... --verify`'s work (it reads them):
the collect itself checks what the server reports (sizes and the manifest lines each object
carries), so that the sample bytes stay in the server.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from hsextract.errors import ConfigError
from hsextract.objectstore.committer import META_EPOCH, META_WRITER, entry_of, publish_header, sample_metadata
from hsextract.objectstore.segments import RUN_KEY, SegmentHead, epoch_head, new_writer_id, publish
from hsextract.objectstore.store import KeyExists, ObjectStore, StoreError
from hsextract.objectstore.tokens import RemoteTokens
from hsextract.objectstore.verify import BucketSet, orphans, read_bucket_set
from hsextract.output.manifest import ManifestEntry, check_header_matches_fields
from hsextract.units import seconds

log = logging.getLogger("hsextract.collect")

BATCH = 256  # samples copied in parallel, then named by one segment


@dataclass
class HostSet:
    name: str
    store: ObjectStore
    found: BucketSet
    orphans: list[str] = field(default_factory=list)


@dataclass
class BucketCollect:
    lines: list[str]
    total: int
    collected_now: int
    exit_code: int = 0


def _run_id(store: ObjectStore) -> str:
    data = store.get_bytes(store.url.key(RUN_KEY))
    return json.loads(data).get("run_id", "") if data else ""


def read_hosts(hosts: Sequence[tuple[str, ObjectStore]]) -> list[HostSet]:
    """Every host's set, checked to be of one configuration and one run."""
    out = []
    for name, store in hosts:
        found = read_bucket_set(store)
        if found.header is None:
            raise ConfigError(f"host {name} ({store.url}): no manifest.json: nothing was drained into it")
        out.append(HostSet(name, store, found, orphans(store, found.fmt, found.published.entries)))
    ref = out[0]
    assert ref.found.header is not None
    runs = {h.name: _run_id(h.store) for h in out}
    if len(set(runs.values())) > 1:
        raise ConfigError(
            "the host sets are of different runs ("
            + ", ".join(f"{n}: {r}" for n, r in runs.items())
            + "): collect the hosts of one run"
        )
    for h in out[1:]:
        assert h.found.header is not None
        check_header_matches_fields(f"host {h.name} ({h.store.url})", h.found.header, ref.found.header)
    return out


def collect_in_place(
    into: ObjectStore,
    hosts: Sequence[tuple[str, ObjectStore]],
    work: Path,
    sizes: Sequence[int] | None,
    vocab_size: int | None,
    workers: int = 8,
) -> BucketCollect:
    """Merge the hosts' sets into `into` (see the module docstring)."""
    from hsextract.objectstore.check import check_store

    check_store(into)
    sets = read_hosts(hosts)
    ref = sets[0].found
    assert ref.header is not None
    fmt = ref.fmt
    before = read_bucket_set(into)
    if before.header is not None:
        check_header_matches_fields(f"the collected set {into.url}", before.header, ref.header)
    have = list(before.published.entries)
    named = {(e.host, e.host_index) for e in have}
    seen = {e.dataset_index for e in have}
    lines: list[str] = []
    todo: list[tuple[HostSet, ManifestEntry]] = []
    duplicates = 0
    every = [(h, e) for h in sets for e in h.found.published.entries]
    for h, e in sorted(every, key=lambda pair: pair[1].dataset_index):
        if (h.name, e.output_index) in named:
            continue
        if e.dataset_index in seen:
            duplicates += 1
            lines.append(
                f"duplicate: dataset index {e.dataset_index} of host {h.name} is in the set already; not taken twice"
            )
            continue
        seen.add(e.dataset_index)
        todo.append((h, e))
    writer = new_writer_id()
    epoch = before.published.next_segment
    publish(into, epoch_head(writer, epoch), [])
    into.put_bytes(into.url.key(RUN_KEY), json.dumps({"run_id": _run_id(sets[0].store)}).encode(), create_only=False)
    publish_header(into, replace(ref.header, run_id=ref.header.run_id))
    segment = epoch + 1
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for first in range(0, len(todo), BATCH):
            batch: list[tuple[HostSet, ManifestEntry, ManifestEntry]] = []
            for h, e in todo[first : first + BATCH]:
                idx = len(have) + len(batch)
                batch.append(
                    (
                        h,
                        e,
                        replace(
                            e, output_index=idx, file=fmt.relative_path(idx), host=h.name, host_index=e.output_index
                        ),
                    )
                )
            list(pool.map(lambda b: _copy(into, b[0], b[1], b[2], writer, epoch), batch))
            entries = [b[2] for b in batch]
            publish(
                into,
                SegmentHead(segment=segment, kind="samples", writer=writer, epoch=epoch, created_at=time.time()),
                entries,
            )
            segment += 1
            have.extend(entries)
    for h in sets:
        if h.orphans:
            lines.append(
                f"orphans: host {h.name} ({h.store.url}) holds {len(h.orphans)} object(s) no manifest "
                f"segment names (uploads of a drain stopped or fenced before their segment; not collected): "
                + ", ".join(h.orphans[:5])
                + (" ..." if len(h.orphans) > 5 else "")
            )
    _write_dataset_files(into, work, ref, have, sets, sizes, vocab_size)
    per_host = {h.name: sum(1 for e in have if e.host == h.name) for h in sets}
    lines.insert(
        0,
        f"collected {len(todo)} new samples into {into.url} in {seconds(time.monotonic() - started)} by "
        f"server-side copy: {len(have)} in the set ("
        + ", ".join(f"{n}: {c}" for n, c in per_host.items())
        + f"); {duplicates} duplicate(s) dropped",
    )
    return BucketCollect(lines, len(have), len(todo))


def _copy(into: ObjectStore, h: HostSet, src: ManifestEntry, new: ManifestEntry, writer: str, epoch: int) -> None:
    """Server-side copy of one sample to its collected name, then confirmed."""
    key = into.url.key(new.file)
    meta = sample_metadata(new, writer, epoch)
    try:
        into.copy(h.store.url.key(src.file), key, source=h.store.url, create_only=True, metadata=meta)
    except KeyExists:
        info = into.head(key)
        theirs = entry_of(info.metadata) if info else None
        if info is not None and info.metadata.get(META_WRITER) == writer and theirs and theirs.rid == new.rid:
            pass  # our own copy, its answer lost
        elif info is not None and int(info.metadata.get(META_EPOCH, "-1") or -1) < epoch:
            into.copy(h.store.url.key(src.file), key, source=h.store.url, create_only=False, metadata=meta)
        else:
            raise StoreError(f"{into.url}/{new.file} exists and is not an orphan of an earlier writer") from None
    info = into.head(key)
    stored = entry_of(info.metadata) if info else None
    if info is None or info.size != src.bytes or stored is None or stored.checksum != src.checksum:
        raise StoreError(
            f"{into.url}/{new.file}: the copy of {h.store.url}/{src.file} holds "
            f"{info.size if info else 'nothing'}, its manifest line says {src.bytes} bytes"
        )


def _write_dataset_files(
    into: ObjectStore,
    work: Path,
    ref: BucketSet,
    entries: list[ManifestEntry],
    sets: Sequence[HostSet],
    sizes: Sequence[int] | None,
    vocab_size: int | None,
) -> None:
    from hsextract.objectstore.mirror import publish_dataset_files
    from hsextract.objectstore.output import sync_work_dir
    from hsextract.objectstore.segments import read_published
    from hsextract.output.finalized import record_finalized

    assert ref.header is not None
    sync_work_dir(into, work, read_published(into))
    tokens = RemoteTokens(into, ref.fmt, work)
    ref.fmt.finalize(work, ref.header, entries, tokens)
    if sizes:
        _write_vocab(work, ref, entries, sets, sizes, vocab_size or ref.header.vocab_size, tokens)
    record_finalized(work, len(entries))
    publish_dataset_files(into, work)


def _write_vocab(
    work: Path,
    ref: BucketSet,
    entries: list[ManifestEntry],
    sets: Sequence[HostSet],
    sizes: Sequence[int],
    vocab_size: int,
    tokens: RemoteTokens,
) -> None:
    """The hosts' published counts summed where they cover the collected samples, the rest recounted
    from the collected objects (hsextract.collect.vocab's rule)."""
    from collections import defaultdict

    from hsextract.output.layout import VOCAB_CHECKPOINT, state_dir
    from hsextract.vocab.checkpoint import entry_identity, read_checkpoint
    from hsextract.vocab.counts import TokenCounts
    from hsextract.vocab.tracker import VocabTracker, recount

    by_host: dict[str, list[ManifestEntry]] = defaultdict(list)
    for e in entries:
        by_host[e.host].append(e)
    total = TokenCounts()
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        for h in sets:
            collected = by_host.get(h.name, [])
            rest = collected
            view = Path(tmp) / h.name
            state_dir(view).mkdir(parents=True)
            data = h.store.get_bytes(h.store.url.key(f".hsextract/{VOCAB_CHECKPOINT}"))
            if data is not None:
                (state_dir(view) / VOCAB_CHECKPOINT).write_bytes(data)
                cp, _ = read_checkpoint(view)
                if cp is not None and cp.matches(h.found.published.entries):
                    mine = {e.host_index for e in collected}
                    if all(i in mine for i in range(cp.covered)):
                        total.merge(cp.counts)
                        rest = [e for e in collected if e.host_index >= cp.covered]
            total.merge(recount(work, ref.fmt, rest, tokens))
    tracker = VocabTracker(work, ref.fmt, sizes, checkpoint_interval_s=0.0)
    tracker.counts, tracker.covered = total, len(entries)
    tracker.last = entry_identity(entries[-1]) if entries else None
    tracker.write_files(vocab_size)
