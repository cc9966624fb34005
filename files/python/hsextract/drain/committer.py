"""The ordered commit: prepared samples get their output index, their final name and their
manifest line, one batch at a time, and only then is their staged dump deleted.

Workers prepare samples in parallel (read, check, encode, write a durable temporary file). One
committer thread then, in arrival order:

1. takes the next output index and renames the temporary file to its final name;
2. fsyncs the directories, appends the batch's manifest lines and fsyncs the manifest;
3. deletes the staged dumps and the client's records of the samples now recorded.

So the manifest is always the contiguous prefix 0..n-1 (the speculators Arrow row of sample i is
``hs_i``), and after a crash at any point each sample is written and recorded once, or still
staged (see hsextract.drain.core). A second dump of a sample already written (the client sent it
again) is dropped here, where the check and the append cannot race.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hsextract.durable import fsync_dir, is_no_space
from hsextract.formats.base import OutputFormat
from hsextract.output.manifest import ManifestAppender, ManifestEntry
from hsextract.staging.dumps import discard_dump
from hsextract.staging.records import remove_record

log = logging.getLogger("hsextract.drain")


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

    def __init__(self, out: Path, fmt: OutputFormat, tmp_dir: Path, dump_dir: Path, entries: list[ManifestEntry],
                 events: CommitEvents):
        self.out, self.fmt, self.tmp_dir, self.dump_dir = Path(out), fmt, Path(tmp_dir), Path(dump_dir)
        self.entries = entries
        self.done_rids = {e.rid for e in entries}
        self.done_indices = {e.dataset_index for e in entries}
        self._events = events
        self._q: queue.Queue[Prepared | None] = queue.Queue()
        self._appender: ManifestAppender | None = None
        self._thread: threading.Thread | None = None

    def is_written(self, rid: str, dataset_index: int) -> bool:
        return rid in self.done_rids or dataset_index in self.done_indices

    def start(self) -> None:
        self._appender = ManifestAppender(self.out)
        self._thread = threading.Thread(target=self._loop, name="drain-commit", daemon=True)
        self._thread.start()

    def put(self, prepared: Prepared) -> None:
        self._q.put(prepared)

    def close(self) -> None:
        """Commit what was put, then stop the thread and close the manifest."""
        self._q.put(None)
        if self._thread is not None:
            self._thread.join()
        if self._appender is not None:
            self._appender.close()

    def _loop(self) -> None:
        try:
            while True:
                first = self._q.get()
                if first is None:
                    return
                batch = [first]
                stop_after = False
                while True:
                    try:
                        nxt = self._q.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop_after = True
                        break
                    batch.append(nxt)
                self._commit(batch)
                if stop_after:
                    return
        except BaseException as exc:
            log.exception("drain committer failed")
            self._events.fail(exc)

    def _commit(self, batch: list[Prepared]) -> None:
        entries, done, dirs = self._place(batch)
        if not entries:
            return
        for d in dirs:
            fsync_dir(d)
        fsync_dir(self.tmp_dir)
        self._append(entries)
        self.entries.extend(entries)
        for e in entries:
            self.done_rids.add(e.rid)
            self.done_indices.add(e.dataset_index)
        # Only now is the sample safe on disk and recorded: the staged copy may go.
        for p in done:
            discard_dump(p.dump)
            remove_record(self.dump_dir, p.rid)
            self._events.settled(p.rid)
        self._events.written(entries, len(self.entries))

    def _place(self, batch: list[Prepared]) -> tuple[list[ManifestEntry], list[Prepared], set[Path]]:
        """Rename each new sample's temporary file to its place in the training set (a second dump of a
        written sample is dropped); their manifest entries, the samples and the directories to fsync."""
        entries: list[ManifestEntry] = []
        done: list[Prepared] = []
        dirs: set[Path] = set()
        now = time.time()
        for p in batch:
            if self.is_written(p.rid, p.dataset_index):
                # A second dump of a written sample (the client resent it): drop it, keep the first.
                p.tmp.unlink(missing_ok=True)
                self._events.duplicate(p)
                self._events.settled(p.rid)
                continue
            idx = len(self.entries) + len(entries)
            rel = self.fmt.relative_path(idx)
            final = self.out / rel
            if not final.parent.exists():
                final.parent.mkdir(parents=True)
                fsync_dir(final.parent.parent)
            os.replace(p.tmp, final)
            dirs.add(final.parent)
            entries.append(ManifestEntry(idx, p.dataset_index, p.rid, p.tokens, rel, p.nbytes, p.checksum, now,
                                         p.fingerprint, p.greedy_check))
            done.append(p)
        return entries, done, dirs

    def _append(self, entries: list[ManifestEntry]) -> None:
        """Append the entries to the manifest durably, waiting out a full volume."""
        assert self._appender is not None
        while True:
            try:
                self._appender.append(entries)
                return
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                self._events.pause_for_space(self.out, exc)
