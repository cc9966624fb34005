"""The bucket as the drain's target (hsextract.output.target): its start, its committer, its token
reader, its publish, its status; and `open_target`, the one place that picks a drain's target.

The drain core (hsextract.drain.core) holds one target and never asks which kind it is. A bucket's
is opened first (`BucketTarget.open`: the server checked, the work directory made the bucket's,
no one fenced); the drain runs its own start checks, then takes the prefix over (`take_over`: the
epoch) just before its committer starts; it asks it for a committer, for a token reader for the
dataset-level files and the draft vocabulary, to publish the dataset-level files once written,
and for a status to show.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hsextract.formats.base import OutputFormat
from hsextract.objectstore.committer import ObjectCommitter
from hsextract.objectstore.mirror import publish_dataset_files
from hsextract.objectstore.output import DrainStart, ObjectOutput, open_drain, take_over
from hsextract.objectstore.retries import describe
from hsextract.objectstore.store import ObjectStore
from hsextract.objectstore.tokens import RemoteTokens
from hsextract.output.committer import CommitEvents
from hsextract.output.layout import drain_tmp_dir
from hsextract.output.manifest import ManifestEntry
from hsextract.output.run_id import load_or_create_run_id
from hsextract.output.target import DirectoryTarget, OutputTarget


def open_target(cfg: Any, fmt: OutputFormat, stop: threading.Event) -> OutputTarget:
    """The drain's target: its settings' bucket (``--output s3://...``), opened (`take_over` comes
    once the drain's start checks passed), or the output directory itself."""
    if cfg.object_store is not None:
        return BucketTarget.open(cfg, fmt, stop)
    return DirectoryTarget()


class BucketTarget:
    """A bucket as the set's home; the drain's work directory holds its bookkeeping."""

    where = "the bucket"
    durable_tmp = False  # a temporary file is uploaded, never renamed into the set

    def __init__(self, target: ObjectOutput, store: ObjectStore, started: DrainStart, fmt: OutputFormat, work: Path):
        self.target, self.store, self.started = target, store, started
        # The dataset-level files are written when the server answers; an outage leaves them for
        # later rather than hold the daemon's loop (and its status) while the uploads wait.
        self._later = store.impatient()
        self.tokens = RemoteTokens(self._later, fmt, drain_tmp_dir(work))
        self._committer: ObjectCommitter | None = None

    @classmethod
    def open(cls, cfg: Any, fmt: OutputFormat, stop: threading.Event) -> BucketTarget:
        """Check the server and make the work directory the bucket's, fencing no one
        (hsextract.objectstore.output.open_drain); `take_over` fences the earlier writers."""
        target: ObjectOutput = cfg.object_store
        work = Path(cfg.output)
        store = ObjectStore(
            target.url, target.settings, stop=stop, pool=target.uploads * 2 + 8, part_size=target.part_size
        )
        started = open_drain(store, work, load_or_create_run_id(work), target)
        return cls(target, store, started, fmt, work)

    def take_over(self) -> None:
        """Publish this drain's epoch (every start check has passed) and hand the committer its
        writer id, epoch and next segment number; SegmentTaken if another drain published since."""
        self.started = take_over(self.store, self.started)
        if self._committer is not None:
            s = self._committer
            s.writer, s.epoch, s.next_segment = self.started.writer, self.started.epoch, self.started.next_segment

    def committer(
        self,
        out: Path,
        relative_path: Callable[[int], str],
        tmp_dir: Path,
        dump_dir: Path,
        entries: list[ManifestEntry],
        events: CommitEvents,
    ) -> ObjectCommitter:
        s = self.started
        self._committer = ObjectCommitter(
            out,
            relative_path,
            tmp_dir,
            dump_dir,
            entries,
            events,
            store=self.store,
            writer=s.writer,
            epoch=s.epoch,
            next_segment=s.next_segment,
            uploads=self.target.uploads,
        )
        return self._committer

    def publish_dataset_files(self, work: Path) -> None:
        publish_dataset_files(self._later, work)

    def last_word(self) -> str | None:
        """The drain's last word on the server: how many retries, of what (hsextract.objectstore.retries)."""
        return f"object store {self.target.url}: {describe(self.store.retries.as_dict())}"

    def status(self) -> dict[str, Any]:
        c = self._committer
        return {
            "url": str(self.target.url),
            "endpoint": self.target.settings.endpoint,
            "writer": self.started.writer,
            "epoch": self.started.epoch,
            "segments": c.next_segment if c else self.started.next_segment,
            "uploading": c.uploading if c else 0,
            "retries": self.store.retries.as_dict(),  # the dataset-level files' too: one log
            "unreachable_since": self.store.outage_since or self._later.outage_since,
        }
