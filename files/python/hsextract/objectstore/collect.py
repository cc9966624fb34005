"""``hsextract collect --into s3://bucket/run/set NAME=s3://bucket/run/NAME ...``: the hosts' sets
in one bucket merged in place, without a sample byte through the controller.

Each host's prefix is read from its own objects: its header, its manifest segments, its draft
vocabulary's published counts, and its orphans (objects no segment names), which are reported,
never collected. The hosts must share one configuration (format, dtype, hidden size, layers) and
one run id. Their samples are merged in dataset-index order (a dataset index two hosts both hold
is taken once, from the first, and reported), numbered from 0 as the trainers' readers want, and
each is **server-side copied** to its name in the collected set (``copy_object`` with
``If-None-Match: *``): the server moves the bytes, the controller sends one request per sample.

Each sample is checked at its source before it is copied, and its copy confirmed before the
segment that names it is published (hsextract.objectstore.collect_copy): the source object must
be its host line's sample as far as the server tells (it exists, has the line's size, carries
hsextract's manifest line of that very sample, and the ETag recorded when it was written), and
no other row may have its bytes (hsextract.output.same_bytes). A sample that fails is listed
with its reason, in ``.hsextract/collect-failures.jsonl`` too, and the others are collected (exit
3, as the directory collect's); every host sample is in the collected set, failed, or a duplicate
of one there, and the collect says so host by host. The collected set's manifest segments carry
each sample's host and index there, and the copy's ETag.

Like a drain, a collect publishes an epoch segment first (one writer per prefix), and can be killed
and run again at any instant: samples already named are skipped, a copy made but never named is
replaced. Collecting again after the hosts wrote more adds what is new, and tries the failed
samples again. The dataset-level files are then rebuilt in a local work directory (the tokens
read back with ranged reads, the draft vocabulary the hosts' counts summed,
hsextract.collect.vocab's rule) and published.

Reading every byte is `hsextract finalize --output s3://... --verify`'s work: the collect checks
what the server reports, so that the sample bytes stay in the server.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from hsextract.contained import UnsafePath
from hsextract.errors import ConfigError
from hsextract.formats.sample_check import SampleCheck
from hsextract.objectstore.collect_copy import BatchCopier, CollectFailure, write_failures
from hsextract.objectstore.committer import publish_header
from hsextract.objectstore.segments import RUN_KEY, epoch_head, new_writer_id, publish
from hsextract.objectstore.store import ObjectStore
from hsextract.objectstore.tokens import RemoteTokens
from hsextract.objectstore.verify import BucketSet, orphans, read_bucket_set
from hsextract.output.collect_reasons import SAME_BYTES
from hsextract.output.manifest import ManifestEntry, check_header_matches_fields
from hsextract.output.same_bytes import describe, host_row_name, row_name, same_bytes
from hsextract.units import seconds

log = logging.getLogger("hsextract.collect")

RUN_CHECK_FAILED = 3  # as the directory collect's: a sample failed


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
    failed: int = 0


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
    before = read_bucket_set(into)
    if before.header is not None:
        check_header_matches_fields(f"the collected set {into.url}", before.header, ref.header)
    have = list(before.published.entries)
    check = SampleCheck(ref.fmt, ref.header)
    plan = _plan(sets, have, check)
    writer = new_writer_id()
    epoch = before.published.next_segment
    publish(into, epoch_head(writer, epoch), [])
    into.put_bytes(into.url.key(RUN_KEY), json.dumps({"run_id": _run_id(sets[0].store)}).encode(), create_only=False)
    publish_header(into, replace(ref.header, run_id=ref.header.run_id))
    started = time.monotonic()
    copier = BatchCopier(into, writer, epoch, check, ref.fmt, epoch + 1)
    failed = plan.failed + copier.run(plan.todo, have, workers)
    write_failures(work, failed)
    _write_dataset_files(into, work, ref, have, sets, sizes, vocab_size)
    new = len(have) - len(before.published.entries)
    per_host = {h.name: sum(1 for e in have if e.host == h.name) for h in sets}
    lines = [
        f"collected {new} new samples into {into.url} in {seconds(time.monotonic() - started)} by server-side "
        "copy: "
        + f"{len(have)} in the set ("
        + ", ".join(f"{n}: {c}" for n, c in per_host.items())
        + f"); {plan.duplicates} duplicate(s) dropped; {len(failed)} failed",
        *plan.lines,
        *[_orphans_line(h) for h in sets if h.orphans],
        *[f.line() for f in failed],
        *_accounts(sets, have, failed),
    ]
    return BucketCollect(lines, len(have), new, RUN_CHECK_FAILED if failed else 0, len(failed))


@dataclass
class _Plan:
    """What a collect takes: the host rows it copies (host, its store, its row), in dataset-index
    order; the rows it fails before any copy (their bytes are another row's); the duplicates it drops."""

    todo: list[tuple[str, ObjectStore, ManifestEntry]] = field(default_factory=list)
    failed: list[CollectFailure] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    duplicates: int = 0


def _named_right(check: SampleCheck, e: ManifestEntry) -> bool:
    try:
        return check.name_problem(e) is None
    except UnsafePath:
        return False


def _plan(sets: Sequence[HostSet], have: list[ManifestEntry], check: SampleCheck) -> _Plan:
    named = {(e.host, e.host_index) for e in have}
    seen = {e.dataset_index for e in have}
    plan = _Plan()
    every = [(h, e) for h in sets for e in h.found.published.entries]
    for h, e in sorted(every, key=lambda pair: pair[1].dataset_index):
        if (h.name, e.output_index) in named:
            continue
        if e.dataset_index in seen:
            plan.duplicates += 1
            plan.lines.append(
                f"duplicate: dataset index {e.dataset_index} of host {h.name} is in the set already; not taken twice"
            )
            continue
        seen.add(e.dataset_index)
        plan.todo.append((h.name, h.store, e))
    # Rows whose objects have one checksum: one of them holds another sample's bytes and nothing
    # tells which, so none of them is collected now (those collected before stay).
    # A row naming another key than its own fails for that (collect_copy.check_source), and is no
    # twin of the row whose object it names.
    named_right = [(n, e) for n, _, e in plan.todo if _named_right(check, e)]
    names = {id(e): row_name(e) for e in have}
    names.update({id(e): host_row_name(n, e) for n, e in named_right})
    twins = same_bytes([*have, *(e for _, e in named_right)])
    keep = []
    for n, store, e in plan.todo:
        if id(e) in twins:
            detail = describe([names[id(o)] for o in twins[id(e)]], e.checksum)
            plan.failed.append(CollectFailure(n, e, SAME_BYTES, f"{store.url}/{e.file}: {detail}"))
        else:
            keep.append((n, store, e))
    plan.todo = keep
    return plan


def _orphans_line(h: HostSet) -> str:
    return (
        f"orphans: host {h.name} ({h.store.url}) holds {len(h.orphans)} object(s) no manifest "
        f"segment names (uploads of a drain stopped or fenced before their segment; not collected): "
        + ", ".join(h.orphans[:5])
        + (" ..." if len(h.orphans) > 5 else "")
    )


def _accounts(sets: Sequence[HostSet], have: list[ManifestEntry], failed: list[CollectFailure]) -> list[str]:
    """Each host's samples: in the collected set, failed, or a duplicate of one there (they add up)."""
    out = []
    for h in sets:
        total = len(h.found.published.entries)
        collected = sum(1 for e in have if e.host == h.name)
        bad = sum(1 for f in failed if f.host == h.name)
        out.append(
            f"host {h.name}: {total} in its set = {collected} in the collected set + {bad} failed + "
            f"{total - collected - bad} duplicate(s) of samples there"
        )
    return out


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
