"""The drain's commit seam for a bucket: prepared samples become objects, then manifest segments.

The drain core hands every prepared sample (a temporary file, its checksum) to its target's
committer (hsextract.output.target). For a directory, the committer (hsextract.output.committer)
renames the file into place and appends the manifest line. For a bucket, this one, in order:

1. gives the sample the next output index and starts its upload to ``<prefix>/<trainer's path>``
   (one PUT, or multipart for large ones), created with ``If-None-Match: *`` and carrying its
   manifest line, its writer and its writer's epoch as metadata; several uploads run at once;
2. confirms the object: its size and recorded checksum, as the server reports them (the body's
   CRC32 went with every PUT and part, and the server checked it), and records its ETag in the
   sample's manifest line, so a reader tells an object replaced since (hsextract.objectstore.object_check);
3. publishes the samples whose objects are confirmed, as a contiguous run of output indices, in
   one manifest segment (hsextract.objectstore.segments), created with ``If-None-Match: *``;
4. only then appends the lines to the work directory's copy of the manifest, deletes the
   temporary files, the staged dumps and the client's records.

A kill at any instant leaves each sample named by a segment with a confirmed object, or still
staged: an object no segment names (an *orphan*) is never read as a sample, and the next drain,
whose epoch fences this one's, writes over it (an object of an earlier epoch is the only one a
writer replaces). A multipart upload cut short is never an object at all.

A create that meets an object of a *later* epoch means a newer drain took the prefix over: this
one stops (`SegmentTaken`), its samples still staged. The server unreachable: every request waits
and retries (hsextract.objectstore.store); uploads in flight are bounded, so the workers, then the
scan, then the client's backpressure hold. A stop meanwhile abandons the uploads in flight; their
samples stay staged.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from hsextract.objectstore.segments import HEADER_KEY, SegmentHead, SegmentTaken, publish
from hsextract.objectstore.store import KeyExists, ObjectStore, Stopped, StoreError, UploadAborted
from hsextract.output.committer import CommitEvents, Committer, Prepared
from hsextract.output.manifest import ManifestEntry, ManifestHeader, check_header_matches_fields, read_header
from hsextract.staging.dumps import discard_dump
from hsextract.staging.records import remove_record

log = logging.getLogger("hsextract.objectstore")

META_ENTRY = "hsextract-entry"  # the sample's manifest line
META_WRITER = "hsextract-writer"
META_EPOCH = "hsextract-epoch"

_WAKE = object()


class WriterFenced(SegmentTaken):
    """A newer drain's object stands where this one meant to create one."""


@dataclass
class _Upload:
    prepared: Prepared
    entry: ManifestEntry
    future: Future = field(default_factory=Future)


def sample_metadata(entry: ManifestEntry, writer: str, epoch: int) -> dict[str, str]:
    line = entry.to_line().decode().strip()
    return {META_ENTRY: line, META_WRITER: writer, META_EPOCH: str(epoch)}


def entry_of(metadata: dict[str, str]) -> ManifestEntry | None:
    """The manifest line an object carries, or None for an object hsextract did not write."""
    try:
        return ManifestEntry.from_dict(json.loads(metadata[META_ENTRY]))
    except (KeyError, ValueError, TypeError):
        return None


class ObjectCommitter(Committer):
    """Owns the set's manifest in a bucket while the drain runs (see the module's docstring)."""

    def __init__(
        self,
        out: Path,
        relative_path: Callable[[int], str],
        tmp_dir: Path,
        dump_dir: Path,
        entries: list[ManifestEntry],
        events: CommitEvents,
        *,
        store: ObjectStore,
        writer: str,
        epoch: int,
        next_segment: int,
        uploads: int = 8,
    ):
        super().__init__(out, relative_path, tmp_dir, dump_dir, entries, events)
        self.store = store
        self.writer, self.epoch, self.next_segment = writer, epoch, next_segment
        self.segments_published = 0
        self._uploads = ThreadPoolExecutor(max_workers=uploads, thread_name_prefix="s3-upload")
        self._parts = ThreadPoolExecutor(max_workers=uploads, thread_name_prefix="s3-part")
        self._room = threading.Semaphore(uploads * 4)  # prepared samples waiting or uploading
        self._pending: deque[_Upload] = deque()
        self._pending_rids: set[str] = set()
        self._header_published = False
        self.bytes_uploaded = 0

    @property
    def uploading(self) -> int:
        """Samples given an index and not yet in a published segment."""
        return len(self._pending)

    # --- the seam -------------------------------------------------------------------------------

    def put(self, prepared: Prepared) -> None:
        """Hand a prepared sample over; waits while too many are uploading (the workers' backpressure)."""
        while not self._room.acquire(timeout=0.2):
            if self.store.stop.is_set():
                break
        self._q.put(prepared)

    def _put_together(self, batch: list[Prepared]) -> None:
        for prepared in batch:  # each waits for room to upload, as `put` does
            self.put(prepared)

    def close(self) -> None:
        super().close()
        self._uploads.shutdown(wait=True, cancel_futures=True)
        self._parts.shutdown(wait=True, cancel_futures=True)

    def _loop(self) -> None:
        try:
            closing = False
            while not (closing and not self._pending):
                item = self._q.get()
                while True:
                    if item is None:
                        closing = True
                    elif isinstance(item, Prepared):
                        self._start(item)
                    try:
                        item = self._q.get_nowait()
                    except queue.Empty:
                        break
                self._publish_ready()
        except BaseException as exc:
            if isinstance(exc, Stopped):
                self._abandon()
                return
            if isinstance(exc, SegmentTaken):
                log.error("%s", exc)
            else:
                log.exception("drain committer failed")
            self._abandon()
            self._events.fail(exc)

    # --- uploads --------------------------------------------------------------------------------

    def _start(self, p: Prepared) -> None:
        if self.is_written(p.rid, p.dataset_index) or p.rid in self._pending_rids:
            # A second dump of a written sample (the client resent it): drop it, keep the first.
            p.tmp.unlink(missing_ok=True)
            self._room.release()
            self._events.duplicate(p)
            self._events.settled(p.rid)
            return
        idx = len(self.entries) + len(self._pending)
        rel = self.relative_path(idx)
        entry = ManifestEntry(
            idx, p.dataset_index, p.rid, p.tokens, rel, p.nbytes, p.checksum, time.time(), p.fingerprint, p.greedy_check
        )
        up = _Upload(p, entry)
        self._pending.append(up)
        self._pending_rids.add(p.rid)
        up.future = self._uploads.submit(self._upload, up)
        up.future.add_done_callback(lambda _f: self._q.put(_WAKE))  # type: ignore[arg-type]

    def _upload(self, up: _Upload) -> None:
        """Create the sample's object and confirm it; raise what stops the drain."""
        p, entry = up.prepared, up.entry
        key = self.store.url.key(entry.file)
        meta = sample_metadata(entry, self.writer, self.epoch)
        try:
            self.store.put_file(key, p.tmp, p.nbytes, create_only=True, metadata=meta, part_pool=self._parts)
        except KeyExists:
            self._replace_or_stop(key, p, entry, meta)
        except UploadAborted:
            raise WriterFenced(
                f"{self.store.url}: the multipart upload of {entry.file} was aborted by a newer drain of this prefix, "
                f"whose epoch fenced this one ({self.writer}, epoch {self.epoch}). This one stops; its samples not "
                "yet in the set are still staged, nothing is lost"
            ) from None
        self._confirm(key, entry)
        self.bytes_uploaded += p.nbytes

    def _replace_or_stop(self, key: str, p: Prepared, entry: ManifestEntry, meta: dict[str, str]) -> None:
        """An object stands at the key: ours (an answer lost and retried), an earlier epoch's orphan
        (replaced), a later epoch's (this drain was fenced: stop), or not hsextract's (refused)."""
        info = self.store.head(key)
        if info is None:  # gone again meanwhile: create it
            self.store.put_file(key, p.tmp, p.nbytes, create_only=True, metadata=meta, part_pool=self._parts)
            return
        if (
            info.metadata.get(META_WRITER) == self.writer
            and info.size == entry.bytes
            and (entry_of(info.metadata) or entry).checksum == entry.checksum
        ):
            return
        found = entry_of(info.metadata)
        try:
            their_epoch = int(info.metadata.get(META_EPOCH, ""))
        except ValueError:
            their_epoch = -1
        if found is None or their_epoch < 0:
            raise StoreError(
                f"{self.store.url}/{entry.file} exists and was not written by hsextract: the prefix "
                "holds files of something else; give the drain a prefix of its own"
            )
        if their_epoch > self.epoch:
            raise WriterFenced(
                f"{self.store.url}: a newer drain (epoch {their_epoch}, {info.metadata.get(META_WRITER, '?')}) writes "
                f"this prefix: {entry.file} is its. This one ({self.writer}, epoch {self.epoch}) stops; its samples "
                "not yet in the set are still staged, nothing is lost"
            )
        if their_epoch == self.epoch:  # our own epoch, another sample: never
            raise StoreError(f"{self.store.url}/{entry.file}: written by this drain for another sample")
        log.info(
            "replacing %s: an orphan of an earlier drain (epoch %d) that no manifest segment names", key, their_epoch
        )
        self.store.put_file(key, p.tmp, p.nbytes, create_only=False, metadata=meta, part_pool=self._parts)

    def _confirm(self, key: str, entry: ManifestEntry) -> None:
        """The object as the server reports it is the sample's; its ETag goes into the sample's line."""
        info = self.store.head(key)
        if info is None:
            raise StoreError(f"{self.store.url}/{entry.file}: uploaded, then not found")
        stored = entry_of(info.metadata)
        if info.size != entry.bytes or stored is None or stored.checksum != entry.checksum:
            raise StoreError(
                f"{self.store.url}/{entry.file}: the server holds {info.size} bytes"
                f"{'' if stored is None else ' with checksum ' + stored.checksum}, the sample is "
                f"{entry.bytes} bytes with checksum {entry.checksum}"
            )
        entry.etag = info.etag

    # --- publishing ----------------------------------------------------------------------------

    def _publish_ready(self) -> bool:
        """Publish the confirmed samples at the head of the queue as one segment; True if any."""
        ready: list[_Upload] = []
        for up in self._pending:
            if not up.future.done():
                break
            exc = up.future.exception()
            if exc is not None:
                raise exc
            ready.append(up)
        if not ready:
            return False
        self._publish_header()
        head = SegmentHead(
            segment=self.next_segment, kind="samples", writer=self.writer, epoch=self.epoch, created_at=time.time()
        )
        entries = [up.entry for up in ready]
        publish(self.store, head, entries)
        self.next_segment += 1
        self.segments_published += 1
        for _ in ready:
            self._pending.popleft()
        self._append(entries)
        self.entries.extend(entries)
        for up in ready:
            p = up.prepared
            self.done_rids.add(p.rid)
            self.done_indices.add(p.dataset_index)
            self._pending_rids.discard(p.rid)
            p.tmp.unlink(missing_ok=True)
            # Only now is the sample in the set: the staged copy may go.
            discard_dump(p.dump)
            remove_record(self.dump_dir, p.rid)
            self._room.release()
            self._events.settled(p.rid)
        self._events.written(entries, len(self.entries))
        return True

    def _publish_header(self) -> None:
        """The set's manifest.json goes up, once, before the first segment that names a sample."""
        if self._header_published:
            return
        header = read_header(self.out)
        if header is None:
            raise StoreError(f"{self.out}: no manifest.json to publish before the first sample")
        publish_header(self.store, header)
        self._header_published = True

    def _abandon(self) -> None:
        """A stop (or a failure) with uploads in flight: their samples stay staged; their temporary
        files are removed at the next start, and an object that did go up is an orphan."""
        if self._pending:
            log.warning("stopping with %d sample(s) not yet in the set: they stay staged", len(self._pending))
        for up in self._pending:
            up.future.cancel()
            self._room.release()
            self._events.settled(up.prepared.rid)
        self._pending.clear()
        self._pending_rids.clear()


def publish_header(store: ObjectStore, header: ManifestHeader) -> None:
    """Create ``manifest.json`` in the bucket; one there already must be of the same configuration."""
    from dataclasses import asdict

    body = (json.dumps(asdict(header), indent=2, sort_keys=True) + "\n").encode()
    try:
        store.put_bytes(store.url.key(HEADER_KEY), body, create_only=True, content_type="application/json")
    except KeyExists:
        theirs = store.get_bytes(store.url.key(HEADER_KEY)) or b"{}"
        check_header_matches_fields(f"{store.url}/{HEADER_KEY}", ManifestHeader.from_dict(json.loads(theirs)), header)
