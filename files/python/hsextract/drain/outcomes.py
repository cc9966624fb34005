"""Where the drain's parts report what became of each sample, and of the drain itself.

The scan (hsextract.drain.scan), the workers (hsextract.drain.worker) and the committer
(hsextract.output.committer) each get this one object and know nothing of one another, of the
stats, of the samples in hand or of the draft vocabulary: whichever part meets a sample's
outcome (written, dropped as a second dump, removed as stale, quarantined), it is counted here,
in one place. So is what concerns the whole drain: a full volume pauses the part that met it
(and the status file says so at once), and an error no sample explains stops the drain.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from hsextract.drain import triage as t
from hsextract.drain.config import DrainConfig
from hsextract.drain.inflight import InFlight
from hsextract.drain.metrics import DrainStats, write_status
from hsextract.drain.quarantine import Quarantine
from hsextract.drain.vocab import DrainVocab
from hsextract.durable import free_bytes
from hsextract.output.committer import Prepared
from hsextract.output.manifest import ManifestEntry
from hsextract.staging.dumps import discard_dump
from hsextract.staging.records import remove_record

log = logging.getLogger("hsextract.drain")


class Outcomes:
    """Thread-safe: called from the scan, the workers and the committer at once."""

    def __init__(
        self, cfg: DrainConfig, stats: DrainStats, inflight: InFlight, vocab: DrainVocab, stop: threading.Event
    ):
        self.stats = stats
        self.fatal: BaseException | None = None  # the error that stopped the drain, if one did
        self._cfg = cfg
        self._dump_dir = Path(cfg.dump_dir)
        self._inflight = inflight
        self._vocab = vocab
        self._stop = stop
        self._quarantine = Quarantine(cfg.quarantine, self._dump_dir, self.pause_for_space)
        self._pause_lock = threading.Lock()

    # --- a sample ------------------------------------------------------------------------------

    def durable(self, rid: str, counts: tuple | None) -> None:
        """A prepared sample's file is durable, with its draft-vocabulary counts (worker)."""
        self._vocab.keep(rid, counts)

    def written(self, entries: list[ManifestEntry], covered: int) -> None:
        """Samples are recorded in the manifest, which now has `covered` entries (committer)."""
        self.stats.add_written(len(entries), sum(e.tokens for e in entries), sum(e.bytes for e in entries))
        self._vocab.commit(entries, covered)
        self._inflight.touch()

    def settled(self, rid: str) -> None:
        """A sample left the drain's hands: written, dropped or quarantined."""
        self._inflight.settled(rid)

    def duplicate(self, p: Prepared) -> None:
        """A prepared sample was already in the set (its dump was sent twice); its temporary file is gone."""
        self._vocab.forget(p.rid)
        self.stale(p.dump, p.rid, t.ALREADY_WRITTEN)

    def stale(self, d: Path, rid: str, why: str) -> None:
        """Remove a staged dump that must not be written (see triage), with its record."""
        if not d.exists():
            return  # removed meanwhile (committed by another thread)
        log.warning("stale dump %s removed: %s", rid, why)
        discard_dump(d)
        remove_record(self._dump_dir, rid)  # none for a probe or a dump without record
        self.stats.add_stale(why)

    def quarantine(self, d: Path, rid: str, reason: str, detail: str) -> None:
        """Move a dump that cannot become a sample to the quarantine, with its reason."""
        if self._quarantine.move(d, rid, reason, detail):
            self.stats.add_quarantined(reason)

    # --- the drain -----------------------------------------------------------------------------

    def fail(self, exc: BaseException) -> None:
        """Stop the drain on an error no sample explains; the first one is the one reported."""
        if self.fatal is None:
            self.fatal = exc
        self._stop.set()
        self._inflight.wake.set()

    def stopping(self) -> bool:
        """Whether the drain was asked to stop (a worker waiting for space gives its sample back)."""
        return self._stop.is_set()

    def pause_for_space(self, path: Path, exc: OSError, stoppable: bool = False) -> None:
        """The volume of `path` is full: wait (saying so in the log and the status), then let the caller retry.

        ``stoppable``: a stop ends the wait at once (a worker whose sample is still staged, and can be
        left there for the next drain); the committer's and the quarantine's waits are not, as what
        they hold is half-way between staging and the set."""
        free = free_bytes(path)
        reason = (
            f"output volume full: {path} has {free} bytes free ({exc.strerror}); "
            f"retrying every {self._cfg.enospc_retry_s:g} s"
        )
        with self._pause_lock:
            if self.stats.paused_reason != reason:
                log.error("%s", reason)
            self.stats.set(paused_reason=reason, state="paused")
        self.write_status()
        if stoppable:
            self._stop.wait(self._cfg.enospc_retry_s)
        else:
            time.sleep(self._cfg.enospc_retry_s)
        with self._pause_lock:
            self.stats.set(paused_reason="", state="running")

    def write_status(self, **extra: object) -> None:
        """Rewrite the status file from the stats (a failed write is logged: the drain goes on)."""
        try:
            write_status(
                self._cfg.output,
                self.stats,
                pid=os.getpid(),
                dump_dir=str(self._dump_dir),
                quarantine_dir=str(self._cfg.quarantine),
                **extra,
            )
        except OSError as exc:
            log.warning("cannot write the status file (%s)", exc)
