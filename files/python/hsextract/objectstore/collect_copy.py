"""One host sample into a collected set in a bucket: checked at its source, copied by the server,
confirmed at its copy, all without a byte of it through this process.

Before the copy, the source object must be its manifest line's sample as far as the server tells
(hsextract.objectstore.object_check: it exists, has the line's size, carries hsextract's manifest
line of that very sample, and has the ETag recorded when it was written). A source that is not is
the sample's failure, with its reason, as the directory collect fails a file that does not verify;
the collect goes on with the others. The copy is made only if the source still has the ETag just
checked (``CopySourceIfMatch``), so an object replaced between the check and the copy is not
copied either; the copy's own ETag goes into the collected set's line.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from hsextract.contained import UnsafePath
from hsextract.durable import atomic_write_bytes
from hsextract.objectstore.committer import META_EPOCH, META_WRITER, entry_of, sample_metadata
from hsextract.objectstore.object_check import object_problem, plain_etag
from hsextract.objectstore.segments import SegmentHead, publish
from hsextract.objectstore.store import KeyExists, ObjectInfo, ObjectMissing, ObjectStore, SourceChanged, StoreError
from hsextract.output.collect_reasons import REASONS, UNSAFE, WRONG_SAMPLE
from hsextract.output.layout import collect_failures_path
from hsextract.output.manifest import ManifestEntry

BATCH = 256  # samples checked and copied in parallel, then named by one segment
NO_METADATA = "collect_no_metadata"  # the source carries no manifest line of hsextract's
# A reason word of hsextract.objectstore.object_check -> the collect failure it is.
_REASONS = {
    "missing": REASONS["missing"],
    "size": REASONS["size"],
    "no_metadata": NO_METADATA,
    "wrong_sample": WRONG_SAMPLE,
    "changed": REASONS["checksum"],
}


@dataclass(frozen=True)
class Failure:
    reason: str
    detail: str


def check_source(store: ObjectStore, check, entry: ManifestEntry) -> tuple[ObjectInfo | None, Failure | None]:
    """The source object of a host's line `entry` and None, or None and why it is not collected
    (`check`: the set's hsextract.formats.sample_check.SampleCheck, for the line's own name)."""
    where = f"{store.url}/{entry.file}"
    try:
        named = check.name_problem(entry)
    except UnsafePath as exc:
        return None, Failure(UNSAFE, f"{store.url}: {exc}; not read")
    if named:
        return None, Failure(WRONG_SAMPLE, f"{store.url}: {named}; not read")
    info = store.head(store.url.key(entry.file))
    problem = object_problem(info, entry, where)
    if problem is not None:
        return None, Failure(_REASONS[problem.reason], problem.detail)
    return info, None


def copy_sample(
    into: ObjectStore, source: ObjectStore, info: ObjectInfo, new, writer: str, epoch: int
) -> Failure | None:
    """Copy the checked source object `info` to `new`'s name in `into` (created once; a copy of this
    writer's, or an earlier writer's orphan, is replaced), confirm it, and record its ETag in
    `new`; or why the sample is not collected after all."""
    key = into.url.key(new.file)
    meta = sample_metadata(new, writer, epoch)
    copy = _copier(into, source, info, key, meta)
    here = f"{source.url}/{source.url.rel(info.key)}"
    try:
        try:
            copy(create_only=True)
        except KeyExists:
            there = into.head(key)
            theirs = entry_of(there.metadata) if there is not None else None
            ours = there is not None and there.metadata.get(META_WRITER) == writer
            if ours and theirs is not None and theirs.rid == new.rid:
                pass  # our own copy, its answer lost
            elif there is None or ours or int(there.metadata.get(META_EPOCH, "-1") or -1) < epoch:
                copy(create_only=False)  # gone again; this collect's copy of another sample no segment names; an orphan
            else:
                raise StoreError(f"{into.url}/{new.file} exists and is not an orphan of an earlier writer") from None
    except SourceChanged:
        return Failure(REASONS["checksum"], f"{here}: replaced while it was collected")
    except ObjectMissing:
        return Failure(REASONS["missing"], f"{here}: removed while it was collected")
    made = into.head(key)
    stored = entry_of(made.metadata) if made else None
    if made is None or made.size != info.size or stored is None or stored.rid != new.rid:
        raise StoreError(
            f"{into.url}/{new.file}: the copy of {here} holds "
            f"{made.size if made else 'nothing'}, its manifest line says {new.bytes} bytes"
        )
    if "-" not in plain_etag(info.etag) and plain_etag(made.etag) != plain_etag(info.etag):
        raise StoreError(
            f"{into.url}/{new.file}: the copy's ETag {plain_etag(made.etag)} is not its source's "
            f"{plain_etag(info.etag)}"
        )
    new.etag = made.etag
    return None


def _copier(into: ObjectStore, source: ObjectStore, info: ObjectInfo, key: str, meta: dict[str, str]):
    def copy(create_only: bool) -> None:
        into.copy(info.key, key, source=source.url, create_only=create_only, metadata=meta, source_etag=info.etag)

    return copy


@dataclass(frozen=True)
class CollectFailure:
    """A host sample a collect did not collect, and why."""

    host: str
    entry: ManifestEntry
    reason: str
    detail: str

    def line(self) -> str:
        e = self.entry
        # The directory collect's words (hsextract.collect.report).
        where = f"{self.host} sample {e.output_index} (dataset index {e.dataset_index})"
        return f"FAILED {where}: {self.reason}: {self.detail}"

    def record(self) -> dict:
        """Its line in ``collect-failures.jsonl`` (the directory collect's journal's fields)."""
        e = self.entry
        return {
            "index": e.dataset_index,
            "rid": e.rid,
            "reason": self.reason,
            "detail": self.detail,
            "host": self.host,
            "host_index": e.output_index,
        }


class BatchCopier:
    """Copies host rows into the collected set BATCH at a time: each source checked, the good ones
    copied in parallel to the next output indices, then the copies up to the first that failed
    named by one segment; the rows after it go again in the next batch, at the indices that follow
    (their copies made meanwhile are this collect's, never named, and are replaced)."""

    def __init__(self, into: ObjectStore, writer: str, epoch: int, check, fmt, segment: int):
        self.into, self.writer, self.epoch, self.check, self.fmt = into, writer, epoch, check, fmt
        self.segment = segment

    def run(
        self, todo: list[tuple[str, ObjectStore, ManifestEntry]], have: list[ManifestEntry], workers: int
    ) -> list[CollectFailure]:
        """Copy `todo` ((host, its store, its row)) after the entries of `have` (extended with what
        is named); the rows that failed."""
        failed: list[CollectFailure] = []
        queue = list(todo)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            while queue:
                batch, queue = queue[:BATCH], queue[BATCH:]
                checked = list(pool.map(lambda row: check_source(row[1], self.check, row[2]), batch))
                ok = []
                for row, (info, failure) in zip(batch, checked, strict=True):
                    if failure is None:
                        ok.append((row, info))
                    else:
                        failed.append(CollectFailure(row[0], row[2], failure.reason, failure.detail))
                news = [self._named(row, len(have) + j) for j, (row, _) in enumerate(ok)]
                results = list(pool.map(self._copy, ok, news))
                cut = next((j for j, r in enumerate(results) if r is not None), len(results))
                if cut < len(results):
                    (host, _, e), _ = ok[cut]
                    bad = results[cut]
                    assert bad is not None
                    failed.append(CollectFailure(host, e, bad.reason, bad.detail))
                    queue = [row for row, _ in ok[cut + 1 :]] + queue
                self._publish(news[:cut], have)
        return failed

    def _named(self, row: tuple[str, ObjectStore, ManifestEntry], index: int) -> ManifestEntry:
        host, _, e = row
        return replace(e, output_index=index, file=self.fmt.relative_path(index), host=host, host_index=e.output_index)

    def _copy(
        self, checked: tuple[tuple[str, ObjectStore, ManifestEntry], ObjectInfo], new: ManifestEntry
    ) -> Failure | None:
        (_, source, _), info = checked
        return copy_sample(self.into, source, info, new, self.writer, self.epoch)

    def _publish(self, entries: list[ManifestEntry], have: list[ManifestEntry]) -> None:
        if not entries:
            return
        head = SegmentHead(
            segment=self.segment, kind="samples", writer=self.writer, epoch=self.epoch, created_at=time.time()
        )
        publish(self.into, head, entries)
        self.segment += 1
        have.extend(entries)


def write_failures(work: Path, failed: list[CollectFailure]) -> None:
    """``.hsextract/collect-failures.jsonl`` of the work directory, published with the set: this
    collect's failed samples (none: no file)."""
    path = collect_failures_path(work)
    if not failed:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, "".join(json.dumps(f.record(), sort_keys=True) + "\n" for f in failed).encode())
