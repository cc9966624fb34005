"""The draft vocabulary while the drain runs: each prepared sample's counts until its commit, the
running counts in step with the manifest (`hsextract.vocab.tracker`), the trainers' files at finalize.

The counts are taken from the very tensors written (by the worker, `keep`), held until the
committer records the sample (`commit`) or drops it as a second dump of a written one (`forget`).
The training set comes first: a vocabulary error (a checkpoint out of step with the manifest, a
sample file that cannot be recounted) stops the counting for the rest of this process, in one
place (`_stop_counting`), and the drain goes on; ``hsextract finalize`` recounts from the files.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

from hsextract.drain.config import DrainConfig
from hsextract.formats.base import OutputFormat, TokenReader
from hsextract.output.manifest import ManifestEntry
from hsextract.vocab.mapping import VocabError
from hsextract.vocab.tracker import VocabTracker

log = logging.getLogger("hsextract.drain")


class DrainVocab:
    """Thread-safe: workers `count`, the committer `commit`s and `forget`s, the daemon writes the files."""

    def __init__(self, cfg: DrainConfig, fmt: OutputFormat):
        self._cfg = cfg
        self._fmt = fmt
        self._tracker: VocabTracker | None = None  # None: not counting (switched off, not recovered, or stopped)
        self._pending: dict[str, tuple] = {}  # rid -> the counts of a prepared sample, until its commit
        self._lock = threading.Lock()

    def recover(self, entries: Sequence[ManifestEntry], tokens: TokenReader | None = None) -> None:
        """Start counting where the manifest's `entries` end (the checkpoint, and a recount of the
        files past it); unless the configuration switches the vocabulary off."""
        cfg = self._cfg
        if not cfg.count_vocab:
            return
        tracker = VocabTracker(
            Path(cfg.output), self._fmt, cfg.draft_vocab_sizes, cfg.vocab_checkpoint_interval_s, tokens
        )
        self._tracker = tracker
        try:
            tracker.recover(entries)
        except VocabError as exc:
            self._stop_counting(exc)

    @property
    def counting(self) -> bool:
        """Whether prepared samples should be counted (`keep`): off, or stopped by an error, they are not."""
        return self._tracker is not None

    def keep(self, rid: str, counts: tuple | None) -> None:
        """Keep the counts of a prepared sample, taken from the tensors just written (by
        hsextract.drain.prepare), until its commit (worker thread)."""
        if self._tracker is not None and counts is not None:
            with self._lock:
                self._pending[rid] = counts

    def forget(self, rid: str) -> None:
        """A prepared sample that will not be recorded (a second dump of a written sample)."""
        with self._lock:
            self._pending.pop(rid, None)

    def commit(self, entries: list[ManifestEntry], covered: int) -> None:
        """Count the samples just recorded in the manifest, which now has `covered` entries (committer thread)."""
        tracker = self._tracker
        if tracker is None:
            return
        with self._lock:
            counts = [self._pending.pop(e.rid, None) for e in entries]
        try:
            tracker.add(entries, counts, covered=covered)
        except VocabError as exc:
            self._stop_counting(exc)

    def write_files(self, vocab_size: int, samples: int) -> None:
        """The trainers' files of the counts of the manifest's `samples` samples; a failure leaves the
        counts checkpointed and only the mapping files missing."""
        if self._tracker is None:
            return
        try:
            paths = self._tracker.write_files(vocab_size)
            log.info("draft vocabulary of %d samples: %d files written (see draft_vocab.json)", samples, len(paths))
        except VocabError as exc:
            log.error("draft vocabulary files not written: %s", exc)

    def _stop_counting(self, exc: VocabError) -> None:
        log.error("draft vocabulary not counted by this process from now on: %s", exc)
        self._tracker = None
