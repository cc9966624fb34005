"""``hsextract finalize --output s3://... [--verify]``: a bucket's set written or checked as a
directory's is.

`verify_bucket` re-reads every object the manifest's segments name (its name, what the server
reports of it: hsextract.objectstore.object_check, then its bytes hashed as they stream in and
its contents: hsextract.formats.sample_check, in parallel) against its manifest line, flags rows
whose objects have the same bytes (hsextract.output.same_bytes), recounts the draft
vocabulary's tokens from the objects against the published counts (only once every sample
passed, as for a directory), and lists the *orphans*:
objects shaped like samples that no segment names (an upload of a drain killed before its
segment, or of a fenced drain). Orphans are not part of the set and not a failure; they are told,
so ``collect`` and an operator know of them. It writes nothing.

`finalize_bucket` rewrites the dataset-level files in the work directory from the segments
and publishes them (hsextract.objectstore.mirror).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.formats.sample_check import SampleCheck
from hsextract.objectstore.object_check import object_problem as reported_problem
from hsextract.objectstore.segments import HEADER_KEY, SEGMENTS_DIR, Published, read_published
from hsextract.objectstore.store import ObjectStore
from hsextract.output.manifest import ManifestEntry, ManifestHeader


@dataclass
class BucketSet:
    """What a bucket's set is, from its own objects."""

    header: ManifestHeader | None
    published: Published
    fmt: Any


def read_bucket_set(store: ObjectStore) -> BucketSet:
    import json

    from hsextract.formats import get_format

    data = store.get_bytes(store.url.key(HEADER_KEY))
    header = ManifestHeader.from_dict(json.loads(data)) if data is not None else None
    published = read_published(store)
    return BucketSet(header, published, get_format(header.format) if header else None)


def orphans(store: ObjectStore, fmt: Any, entries: Sequence[ManifestEntry]) -> list[str]:
    """Set-relative paths of the objects shaped like sample files that no segment names."""
    named = {e.file for e in entries}
    found = []
    for info in store.list_objects():
        rel = store.url.rel(info.key)
        if fmt.file_pattern.match(rel) and rel not in named:
            found.append(rel)
    return found


def object_problem(
    store: ObjectStore, entry: ManifestEntry, tmp_dir: Path, check: SampleCheck | None = None
) -> str | None:
    """None if the object is the entry's sample, else what is wrong: its name, what the server
    reports of it (hsextract.objectstore.object_check), then its bytes (size and checksum) and,
    with `check`, its contents (token count, shapes, fingerprint: hsextract.formats.sample_check)."""
    key = store.url.key(entry.file)
    where = f"{store.url}/{entry.file}"
    if check is not None:
        named = check.name_problem(entry)
        if named:
            return named
    reported = reported_problem(store.head(key), entry, where)
    if reported is not None:
        return reported.detail
    algorithm = entry.checksum.split(":", 1)[0]
    with tempfile.NamedTemporaryFile(dir=tmp_dir) as f:
        n, checksum = store.download(key, Path(f.name), algorithm)
        if n != entry.bytes or checksum != entry.checksum:
            return f"{where}: checksum {checksum}, manifest says {entry.checksum}"
        if check is not None:
            wrong = check.content_problem(Path(f.name), entry)
            if wrong:
                return f"{where}: {wrong}"
    return None


def verify_bucket(store: ObjectStore, sizes: Sequence[int], check_vocab: bool, threads: int = 8) -> int:
    """Print a BAD line per problem and the orphans; 1 if any problem was found, else 0."""
    from hsextract.output.same_bytes import describe, row_name, same_bytes

    found = read_bucket_set(store)
    if found.header is None:
        print(f"BAD {store.url}: no manifest.json; nothing was drained into this prefix yet")
        return 1
    entries = found.published.entries
    sample_check = SampleCheck(found.fmt, found.header)
    twins = same_bytes(e for e in entries if e.file == found.fmt.relative_path(e.output_index))
    with tempfile.TemporaryDirectory() as tmp:

        def check(e: ManifestEntry) -> tuple[ManifestEntry, str | None]:
            problem = object_problem(store, e, Path(tmp), sample_check)
            if problem is None and id(e) in twins:
                problem = describe([row_name(o) for o in twins[id(e)]], e.checksum)
            return e, problem

        with ThreadPoolExecutor(max_workers=threads) as pool:
            results = list(pool.map(check, entries))
        bad = 0
        for e, problem in results:
            if problem:
                bad += 1
                print(f"BAD {e.output_index} ({e.rid}): {problem}")
        print(
            f"verified {len(entries) - bad}/{len(entries)} samples in {len(found.published.heads)} manifest "
            f"segments of {store.url} (name, what the server reports, size, checksum, shapes, fingerprint)"
        )
        lost = orphans(store, found.fmt, entries)
        if lost:
            print(
                f"orphans: {len(lost)} object(s) no manifest segment names (uploads of a drain stopped or fenced "
                f"before their segment; not part of the set): {', '.join(lost[:5])}" + (" ..." if len(lost) > 5 else "")
            )
        if check_vocab and bad:
            print(
                f"draft vocabulary: not checked, {bad} sample object(s) are BAD: put them right (or their lines) "
                "and verify again"
            )
        elif check_vocab:
            bad += _verify_vocab(store, found, sizes, Path(tmp))
    print(f"{store.url}: checked, nothing written")
    return 1 if bad else 0


def _verify_vocab(store: ObjectStore, found: BucketSet, sizes: Sequence[int], tmp: Path) -> int:
    """The published counts and token-frequency files against a recount of the objects."""
    from hsextract.objectstore.tokens import RemoteTokens
    from hsextract.output.layout import state_dir
    from hsextract.vocab.tracker import VocabTracker, print_recount_verdict

    view = tmp / "view"  # the set's small files, where the tracker reads its checkpoint and token_freq
    view.mkdir()
    for info in store.list_objects():
        rel = store.url.rel(info.key)
        if found.fmt.file_pattern.match(rel) or rel.startswith(SEGMENTS_DIR) or rel.endswith(".arrow"):
            continue
        dest = view / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        store.download(info.key, dest)
    state_dir(view).mkdir(exist_ok=True)
    entries = found.published.entries
    tokens = RemoteTokens(store, found.fmt, tmp)
    tracker = VocabTracker(view, found.fmt, sizes, checkpoint_interval_s=0.0, tokens=tokens)
    return print_recount_verdict(tracker, entries, "objects")


def finalize_bucket(
    store: ObjectStore, work: Path, sizes: Sequence[int], vocab_size: int | None, count_vocab: bool
) -> list[str]:
    """The dataset-level files rewritten in the work directory from the bucket's segments, then
    published; the paths published."""
    from hsextract.objectstore.mirror import publish_dataset_files
    from hsextract.objectstore.output import sync_work_dir
    from hsextract.objectstore.tokens import RemoteTokens
    from hsextract.output.finalized import record_finalized
    from hsextract.vocab.tracker import VocabTracker

    found = read_bucket_set(store)
    if found.header is None:
        from hsextract.errors import ConfigError

        raise ConfigError(f"{store.url}: no manifest.json; nothing was drained into this prefix yet")
    entries = found.published.entries
    sync_work_dir(store, work, found.published)
    tokens = RemoteTokens(store, found.fmt, work)
    found.fmt.finalize(work, found.header, entries, tokens)
    if count_vocab:
        tracker = VocabTracker(work, found.fmt, sizes, checkpoint_interval_s=0.0, tokens=tokens)
        tracker.recover(entries)
        tracker.write_files(vocab_size or found.header.vocab_size)
    record_finalized(work, len(entries))
    return publish_dataset_files(store, work)
