"""The drain's dataset-level files: the format's (the Arrow dataset, ``sample_lengths.json``), the
draft vocabulary's and the draft config, rebuilt when samples came since the last time, then
recorded as covering the manifest's first n samples (hsextract.output.finalized) and published by
the drain's target (hsextract.output.target).

A full volume pauses and retries, as for samples; a stop meanwhile leaves them behind (said in the
log and by ``hsextract status``; the next drain or ``hsextract finalize`` writes them). A target
that does not answer (a bucket's server) leaves them for later: the drain's loop is not held.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from hsextract.drain.config import DrainConfig
from hsextract.drain.draft_files import write_draft_files_logged
from hsextract.drain.metrics import DrainStats
from hsextract.drain.outcomes import Outcomes
from hsextract.drain.vocab import DrainVocab
from hsextract.durable import is_no_space
from hsextract.formats.base import OutputFormat
from hsextract.output.finalized import record_finalized
from hsextract.output.manifest import ManifestEntry, ManifestHeader
from hsextract.output.target import OutputTarget, TargetUnreachable

log = logging.getLogger("hsextract.drain")

# A target that did not answer a finalize (a bucket's server) is asked again after this long.
FINALIZE_RETRY_S = 5.0


class DatasetFiles:
    """Keeps the dataset-level files up to the manifest; says why they lag behind when they do."""

    def __init__(
        self,
        cfg: DrainConfig,
        fmt: OutputFormat,
        vocab: DrainVocab,
        outcomes: Outcomes,
        stats: DrainStats,
        stop: threading.Event,
    ):
        self.cfg, self.fmt, self.out = cfg, fmt, Path(cfg.output)
        self._vocab, self._outcomes, self._stats, self._stop = vocab, outcomes, stats, stop
        self.covered = -1  # the samples they were last written for (-1: not yet by this drain)
        self.problem = ""  # why they lag behind the manifest, for the status and the exit code
        self._later_at = 0.0  # the target did not answer: not before then

    def update(self, target: OutputTarget, header: ManifestHeader | None, entries: list[ManifestEntry]) -> None:
        """Rebuild them if samples came since, and record how many they cover."""
        n = len(entries)
        if n == self.covered or header is None:
            return
        if time.monotonic() < self._later_at and not self._stop.is_set():
            return
        while True:
            try:
                paths = self._write(target, header, entries, n)
                break
            except TargetUnreachable as exc:  # the target does not answer: the files wait for it
                self._wait_for(target, n, exc)
                return
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                if self._stop.is_set():
                    self.problem = (
                        f"the output volume was full ({exc.strerror}) when the drain stopped, so the dataset-level "
                        f"files were not written for the {n} samples of the manifest; the next drain, or `hsextract "
                        f"finalize --output {self.out}` once there is space, writes them"
                    )
                    log.error("%s", self.problem)
                    return
                self._outcomes.pause_for_space(self.out, exc)
        self.covered, self._later_at, self.problem = n, 0.0, ""
        self._stats.set(finalized_samples=n)
        if paths:
            log.info("dataset-level files rebuilt for %d samples: %s", n, ", ".join(p.name for p in paths))

    def _write(self, target: OutputTarget, header: ManifestHeader, entries: list[ManifestEntry], n: int) -> list[Path]:
        """The format's, the draft vocabulary's and the config files, then the record that they cover
        `n` samples; then published by the target."""
        paths = self.fmt.finalize(self.out, header, list(entries), target.tokens)
        self._vocab.write_files(self.cfg.vocab_size or header.vocab_size, n)
        paths += write_draft_files_logged(self.out, header, entries, self.cfg.model_path, self.cfg.draft_vocab_sizes)
        record_finalized(self.out, n)
        target.publish_dataset_files(self.out)
        return paths

    def _wait_for(self, target: OutputTarget, n: int, exc: TargetUnreachable) -> None:
        if not self._later_at:
            log.warning("the dataset-level files for %d samples wait for %s: %s", n, target.where, exc)
        self.problem = (
            f"the dataset-level files for {n} samples are not yet in {target.where}: {exc}; the "
            "drain writes them once the server answers"
        )
        self._later_at = time.monotonic() + FINALIZE_RETRY_S
