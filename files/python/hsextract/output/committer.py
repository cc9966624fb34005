"""The commit's types: a prepared sample (`Prepared`), what becomes of it (`CommitEvents`), and the
committer of a set in a directory, whose thread gives prepared samples their output index, their
final name and their manifest line, one batch at a time, and only then deletes their staged dump.

The drain's workers prepare samples in parallel (read, check, encode, write a durable temporary
file) and hand each to the committer of the drain's target (hsextract.output.target; a bucket's is
hsextract.objectstore.committer, which subclasses this one). One committer thread then, in arrival
order:

1. drops a second dump of a sample already written (the client sent it again), here, where the
   check and the append cannot race;
2. commits the others (hsextract.output.commit, the ordered commit collect uses too): each takes
   the next output index and is renamed to its final name, the directories are fsynced, the
   batch's manifest lines appended and the manifest fsynced; a full volume pauses the drain
   (`CommitEvents.pause_for_space`) and the step is tried again;
3. deletes the staged dumps and the client's records of the samples now recorded.

So the manifest is always the contiguous prefix 0..n-1 (the speculators Arrow row of sample i is
``hs_i``), and after a crash at any point each sample is written and recorded once, or still
staged (see hsextract.drain.core). The commit itself, which collect uses too, is hsextract.output.commit.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from hsextract.output.commit import OrderedCommit, ToCommit
from hsextract.output.manifest import ManifestEntry
from hsextract.staging.dumps import discard_dump
from hsextract.staging.records import remove_record

log = logging.getLogger("hsextract.drain")  # the drain's commit thread runs it


@dataclass
class Prepared:
    """A sample whose temporary file is durable, waiting for its output index."""

    rid: str
    dataset_index: int
    tokens: int
    tmp: Path
    nbytes: int
    checksum: str
    dump: Path
    fingerprint: str = ""
    greedy_check: str = ""

    def row(self, output_index: int, file: str, written_at: float) -> ManifestEntry:
        """Its manifest line, once it is the sample `output_index` at `file`."""
        return ManifestEntry(
            output_index,
            self.dataset_index,
            self.rid,
            self.tokens,
            file,
            self.nbytes,
            self.checksum,
            written_at,
            self.fingerprint,
            self.greedy_check,
        )


class CommitEvents(Protocol):
    """What the committer reports (hsextract.drain.outcomes.Outcomes)."""

    def duplicate(self, p: Prepared) -> None:
        """A prepared sample already in the set (its temporary file is gone)."""

    def settled(self, rid: str) -> None:
        """A sample left the drain's hands (written or dropped)."""

    def written(self, entries: list[ManifestEntry], covered: int) -> None:
        """A batch is recorded in the manifest, which now has `covered` entries."""

    def pause_for_space(self, path: Path, exc: OSError) -> None:
        """A full volume waits for space; it does not fail."""

    def fail(self, exc: BaseException) -> None:
        """The commit thread died: the drain must stop."""


class Committer:
    """Owns the manifest while the drain runs: its entries, its appender, the commit thread."""

    def __init__(
        self,
        out: Path,
        relative_path: Callable[[int], str],
        tmp_dir: Path,
        dump_dir: Path,
        entries: list[ManifestEntry],
        events: CommitEvents,
    ):
        """`relative_path`: where the format puts sample i (its `OutputFormat.relative_path`)."""
        self.out, self.tmp_dir, self.dump_dir = Path(out), Path(tmp_dir), Path(dump_dir)
        self.relative_path = relative_path
        self.entries = entries
        self.done_rids = {e.rid for e in entries}
        self.done_indices = {e.dataset_index for e in entries}
        self._events = events
        self._q: queue.Queue[Prepared | list[Prepared] | None] = queue.Queue()
        self._held = threading.local()  # a thread's puts inside `together`
        self._ordered: OrderedCommit | None = None  # the manifest's appender, from `start` on
        self._thread: threading.Thread | None = None

    def is_written(self, rid: str, dataset_index: int) -> bool:
        return rid in self.done_rids or dataset_index in self.done_indices

    def start(self) -> None:
        self._ordered = OrderedCommit(
            self.out, self.relative_path, len(self.entries), self._wait_for_space, tmp_dir=self.tmp_dir
        )
        self._thread = threading.Thread(target=self._loop, name="drain-commit", daemon=True)
        self._thread.start()

    def put(self, prepared: Prepared) -> None:
        held = getattr(self._held, "batch", None)
        if held is not None:
            held.append(prepared)
        else:
            self._q.put(prepared)

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """The samples this thread puts inside are committed in one step: those one pass of the
        self-check settles (hsextract.drain.check_queue) reach the manifest together."""
        self._held.batch = []
        try:
            yield
        finally:
            batch, self._held.batch = self._held.batch, None
            self._put_together(batch)

    def _put_together(self, batch: list[Prepared]) -> None:
        if batch:
            self._q.put(batch)

    def close(self) -> None:
        """Commit what was put, then stop the thread and close the manifest."""
        self._q.put(None)
        if self._thread is not None:
            self._thread.join()
        if self._ordered is not None:
            self._ordered.close()

    def _loop(self) -> None:
        try:
            while True:
                first = self._q.get()
                if first is None:
                    return
                batch = first if isinstance(first, list) else [first]
                stop_after = False
                while True:
                    try:
                        nxt = self._q.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop_after = True
                        break
                    batch += nxt if isinstance(nxt, list) else [nxt]
                self._commit(batch)
                if stop_after:
                    return
        except BaseException as exc:
            log.exception("drain committer failed")
            self._events.fail(exc)

    def _commit(self, batch: list[Prepared]) -> None:
        assert self._ordered is not None
        new = self._drop_written(batch)
        if not new:
            return
        now = time.time()
        entries, _ = self._ordered.commit([ToCommit(p.tmp, partial(p.row, written_at=now)) for p in new])
        self.entries.extend(entries)
        for e in entries:
            self.done_rids.add(e.rid)
            self.done_indices.add(e.dataset_index)
        # Only now is the sample safe on disk and recorded: the staged copy may go.
        for p in new:
            discard_dump(p.dump)
            remove_record(self.dump_dir, p.rid)
            self._events.settled(p.rid)
        self._events.written(entries, len(self.entries))

    def _drop_written(self, batch: list[Prepared]) -> list[Prepared]:
        """The samples of `batch` not yet in the set; a second dump of a written sample (the client
        resent it) is dropped: its temporary file removed, the first one kept."""
        new = []
        for p in batch:
            if self.is_written(p.rid, p.dataset_index):
                p.tmp.unlink(missing_ok=True)
                self._events.duplicate(p)
                self._events.settled(p.rid)
            else:
                new.append(p)
        return new

    def _wait_for_space(self, exc: OSError) -> bool:
        """The drain's full-volume policy: pause until there is space, then try again."""
        self._events.pause_for_space(self.out, exc)
        return True

    def _append(self, entries: list[ManifestEntry]) -> None:
        """Append lines whose samples are in place by other means (a bucket's objects) to the
        manifest durably, waiting out a full volume."""
        assert self._ordered is not None
        self._ordered.record(entries)
