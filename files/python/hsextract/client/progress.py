"""Counters of a client run, and the ways they are shown: status file, progress bar, log lines, summary.

An operator watches a days-long run through ``hsextract status`` (which reads the status file),
through the journal (plain log lines every few tens of seconds under systemd) or on a terminal
(a live bar). The drain's ``--exit-when-done`` waits for the summary file, so the summary is
written atomically and only by a run that has an answer for every sample.

The producer, the sender threads, the capture's watch and the reporter share one `RunStats`: it
takes its own lock for every change, and every wait of the run (the server down, the start-up's
checks, the staging limits) is one `RunStats.paused`, which the status shows (``paused_reason``,
``paused_for_s``) and adds to the run's paused time (``paused_s``). The files themselves are
hsextract.output.run_files' `ClientStatus` and `ClientSummary`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from hsextract.output.layout import client_status_path
from hsextract.output.run_files import ClientStatus, ClientSummary, write_client_status
from hsextract.report import progress_line
from hsextract.run_progress import RateWindow, StatusReporter
from hsextract.shard import WHOLE, Shard

log = logging.getLogger("hsextract.client")


@dataclass
class RunStats:
    """Counters shared by the producer and the sender threads: read them freely, change them only
    through the methods (each takes the stats' lock)."""

    samples_total: int = 0  # lines of this shard
    dataset_lines: int = 0  # lines of the whole dataset
    shard: Shard = WHOLE
    sent: int = 0
    ok: int = 0
    skipped: int = 0  # already in the training set or staged by an earlier run
    truncated: int = 0
    tokens: int = 0  # prompt tokens of samples answered ok
    failed: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)
    retried: Counter = field(default_factory=Counter)  # sends again, by why (capture_failed, capture_missing)
    awaiting_capture: int = 0  # answered by the server, waiting for the capture's word
    in_flight: int = 0
    in_flight_tokens: int = 0
    paused_reason: str | None = None
    paused_s: float = 0.0  # pauses that have ended
    paused_since: float | None = None  # time.monotonic() of the pause under way, if one is
    state: str = "running"
    error: str = ""
    startup_s: dict[str, float] = field(default_factory=dict)  # each start-up phase (hsextract.client.startup)
    started: float = field(default_factory=time.monotonic)
    started_at: float = field(default_factory=time.time)
    # Which start of the client this is: its summary carries it, so a drain tells a new run's end
    # from the last run's summary (hsextract.output.client_files.summary_id).
    attempt: str = field(default_factory=lambda: secrets.token_hex(8))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _window: RateWindow = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._window = RateWindow(self.started)

    @property
    def done(self) -> int:
        """Samples that need nothing more from this run."""
        return self.ok + self.skipped + sum(self.failed.values()) + sum(self.rejected.values())

    # -- the counters -----------------------------------------------------------------------------

    def sending(self, tokens: int) -> None:
        """A request of `tokens` prompt tokens goes to the server."""
        with self._lock:
            self.sent += 1
            self.in_flight += 1
            self.in_flight_tokens += tokens

    def answered(self, tokens: int) -> None:
        """The server is done with a request of `tokens` (answered, failed or stopped)."""
        with self._lock:
            self.in_flight -= 1
            self.in_flight_tokens -= tokens

    def record_ok(self, tokens: int) -> None:
        with self._lock:
            self.ok += 1
            self.tokens += tokens
            self._window.add(self.tokens, self.ok)

    def record_failed(self, reason: str) -> None:
        with self._lock:
            self.failed[reason] += 1

    def record_retried(self, reason: str) -> None:
        with self._lock:
            self.retried[reason] += 1

    def record_rejected(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] += 1

    def record_skipped(self) -> None:
        with self._lock:
            self.skipped += 1

    def record_truncated(self) -> None:
        with self._lock:
            self.truncated += 1

    def set_awaiting(self, n: int) -> None:
        """Answered samples waiting for the capture's word, now."""
        with self._lock:
            self.awaiting_capture = n

    def finish(self, state: str, error: str = "") -> None:
        """The run's final state (done, stopped, failed with its error); no pause goes on past it."""
        with self._lock:
            self.state, self.error = state, error
            self._end_pause()

    # -- the pauses -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def paused(self, reason: str) -> Iterator[Callable[[str], None]]:
        """The run waits for `reason` inside the block: the status shows it, and its time is added
        to the run's pauses when the block ends. The block is given a function that tells a new
        reason for the same pause (the staging limits' reason changes as the wait goes on)."""
        self.pause_begins(reason)
        try:
            yield self.pause_begins
        finally:
            self.pause_ends()

    def pause_begins(self, reason: str) -> None:
        """A pause for ``reason`` starts now, or goes on (its reason may change)."""
        with self._lock:
            if self.paused_since is None:
                self.paused_since = time.monotonic()
            self.paused_reason = reason

    def pause_ends(self) -> None:
        with self._lock:
            self._end_pause()

    def _end_pause(self) -> None:
        if self.paused_since is not None:
            self.paused_s += time.monotonic() - self.paused_since
            self.paused_since = None
        self.paused_reason = None

    def pause_under_way_s(self) -> float | None:
        """Seconds of the pause under way, None if there is none (read once: the sender ends pauses
        in its own thread)."""
        since = self.paused_since
        return None if since is None else time.monotonic() - since

    @property
    def paused_total_s(self) -> float:
        """Seconds paused so far, the pause under way included: the status shows a pause growing."""
        return self.paused_s + (self.pause_under_way_s() or 0.0)

    def rates(self) -> tuple[float, float]:
        """(tokens/s, samples/s) over the last ~60 s of answers, or since the start if shorter."""
        return self._window.rates(self.tokens, self.ok)

    # -- the files --------------------------------------------------------------------------------

    def status(self) -> ClientStatus:
        """The status file's record, now."""
        with self._lock:
            tok_s, smp_s = self.rates()
            remaining = max(0, self.samples_total - self.done)
            eta = remaining / smp_s if smp_s > 0 else None
            under_way = self.pause_under_way_s()
            return ClientStatus(
                state="paused" if self.state == "running" and self.paused_reason else self.state,
                samples_total=self.samples_total,
                sent=self.sent,
                ok=self.ok,
                skipped=self.skipped,
                truncated=self.truncated,
                failed=sum(self.failed.values()),
                rejected=sum(self.rejected.values()),
                failed_by_reason=dict(self.failed),
                rejected_by_reason=dict(self.rejected),
                retried_by_reason=dict(self.retried),
                in_flight=self.in_flight,
                awaiting_capture=self.awaiting_capture,
                tokens=self.tokens,
                tokens_per_s=round(tok_s, 1),
                eta_s=None if eta is None else round(eta, 1),
                paused_reason=self.paused_reason,
                paused_s=round(self.paused_total_s, 1),
                paused_for_s=None if under_way is None else round(under_way, 1),
                error=self.error,
                shard=self.shard,
                attempt=self.attempt,
                pid=os.getpid(),
                started_at=self.started_at,
                updated_at=time.time(),
            )

    def snapshot(self) -> dict[str, Any]:
        """The status file's object, now."""
        return self.status().to_json()

    def summary_record(self) -> ClientSummary:
        """The summary file's record (written once every sample has an outcome)."""
        with self._lock:
            return ClientSummary(
                state=self.state,
                samples_total=self.samples_total,
                dataset_lines=self.dataset_lines,
                shard=self.shard,
                ok=self.ok,
                skipped=self.skipped,
                truncated=self.truncated,
                failed=dict(self.failed),
                rejected=dict(self.rejected),
                retried=dict(self.retried),
                tokens=self.tokens,
                wall_s=round(time.monotonic() - self.started, 2),
                paused_s=round(self.paused_total_s, 1),
                startup_s=dict(self.startup_s),
                attempt=self.attempt,
                finished_at=time.time(),
            )

    def summary(self) -> dict[str, Any]:
        return self.summary_record().to_json()


class Reporter(StatusReporter[ClientStatus]):
    """The client's status file and progress; logs each pause and the resumption once."""

    def __init__(
        self,
        stats: RunStats,
        output: str | Path,
        stream: TextIO | None = None,
        status_every: float = 1.0,
        log_every: float = 30.0,
        shard: Shard = WHOLE,
    ):
        super().__init__(client_status_path(output, shard), log, stream, status_every, log_every)
        self.stats = stats
        self._last_paused: str | None = None

    def snapshot(self) -> ClientStatus:
        return self.stats.status()

    def write(self, snap: ClientStatus) -> None:
        write_client_status(self.status_path, snap)

    def line(self, snap: ClientStatus) -> str:
        return progress_line(snap.to_json())

    def fraction_done(self, snap: ClientStatus) -> float:
        done = (snap.ok or 0) + (snap.skipped or 0) + (snap.failed or 0) + (snap.rejected or 0)
        return done / max(1, snap.samples_total or 0)

    def noticed(self, snap: ClientStatus) -> None:
        if snap.paused_reason != self._last_paused:
            if snap.paused_reason:
                log.warning("paused: %s", snap.paused_reason)
            elif self._last_paused and snap.state == "running":
                log.info("resumed sending")  # not when the pause ended because the run did
            self._last_paused = snap.paused_reason
