"""The bucket as the drain's target (hsextract.output.target): its start, its committer, its token
reader, its publish, its status; and `open_target`, the one place that picks a drain's target.

The drain core (hsextract.drain.core) holds one target and never asks which kind it is: it asks
it for a committer, for a token reader for the dataset-level files and the draft vocabulary, to
publish the dataset-level files once written, and for a status to show.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hsextract.formats.base import OutputFormat
from hsextract.objectstore.committer import ObjectCommitter
from hsextract.objectstore.mirror import publish_dataset_files
from hsextract.objectstore.output import DrainStart, ObjectOutput, start_drain
from hsextract.objectstore.store import ObjectStore
from hsextract.objectstore.tokens import RemoteTokens
from hsextract.output.committer import CommitEvents
from hsextract.output.layout import drain_tmp_dir
from hsextract.output.manifest import ManifestEntry
from hsextract.output.run_id import load_or_create_run_id
from hsextract.output.target import DirectoryTarget, OutputTarget


def open_target(cfg: Any, fmt: OutputFormat, stop: threading.Event) -> OutputTarget:
    """The drain's target: its settings' bucket (``--output s3://...``), taken over now, or the
    output directory itself."""
    if cfg.object_store is not None:
        return BucketTarget.start(cfg, fmt, stop)
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
    def start(cls, cfg: Any, fmt: OutputFormat, stop: threading.Event) -> BucketTarget:
        """Check the server and take the prefix over (hsextract.objectstore.output.start_drain)."""
        target: ObjectOutput = cfg.object_store
        work = Path(cfg.output)
        store = ObjectStore(
            target.url, target.settings, stop=stop, pool=target.uploads * 2 + 8, part_size=target.part_size
        )
        started = start_drain(store, work, load_or_create_run_id(work), target)
        return cls(target, store, started, fmt, work)

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

    def status(self) -> dict[str, Any]:
        c = self._committer
        return {
            "url": str(self.target.url),
            "endpoint": self.target.settings.endpoint,
            "writer": self.started.writer,
            "epoch": self.started.epoch,
            "segments": c.next_segment if c else self.started.next_segment,
            "uploading": c.uploading if c else 0,
            "retries": self.store.retries + self._later.retries,
            "unreachable_since": self.store.outage_since or self._later.outage_since,
        }
