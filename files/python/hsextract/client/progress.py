"""Counters of a client run, and the ways they are shown: status file, progress bar, log lines, summary.

An operator watches a days-long run through ``hsextract status`` (which reads the status file),
through the journal (plain log lines every few tens of seconds under systemd) or on a terminal
(a live bar). The drain's ``--exit-when-done`` waits for the summary file, so the summary is
written atomically and only by a run that has an answer for every sample.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from hsextract.output.layout import client_status_path
from hsextract.report import progress_line
from hsextract.run_progress import RateWindow, StatusReporter
from hsextract.shard import WHOLE, Shard

log = logging.getLogger("hsextract.client")

@dataclass
class RunStats:
    """Counters shared by the producer and the sender threads (update under `lock`)."""

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
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _window: RateWindow = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._window = RateWindow(self.started)

    @property
    def done(self) -> int:
        """Samples that need nothing more from this run."""
        return self.ok + self.skipped + sum(self.failed.values()) + sum(self.rejected.values())

    def pause_begins(self, reason: str) -> None:
        """A pause for ``reason`` starts now, or goes on (its reason may change)."""
        if self.paused_since is None:
            self.paused_since = time.monotonic()
        self.paused_reason = reason

    def pause_ends(self) -> None:
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

    def record_ok(self, tokens: int) -> None:
        with self.lock:
            self.ok += 1
            self.tokens += tokens
            self._window.add(self.tokens, self.ok)

    def rates(self) -> tuple[float, float]:
        """(tokens/s, samples/s) over the last ~60 s of answers, or since the start if shorter."""
        return self._window.rates(self.tokens, self.ok)

    def snapshot(self) -> dict[str, Any]:
        tok_s, smp_s = self.rates()
        remaining = max(0, self.samples_total - self.done)
        eta = remaining / smp_s if smp_s > 0 else None
        state = "paused" if self.state == "running" and self.paused_reason else self.state
        return {
            "state": state,
            "samples_total": self.samples_total,
            "sent": self.sent,
            "ok": self.ok,
            "skipped": self.skipped,
            "truncated": self.truncated,
            "failed": sum(self.failed.values()),
            "rejected": sum(self.rejected.values()),
            "failed_by_reason": dict(self.failed),
            "rejected_by_reason": dict(self.rejected),
            "retried_by_reason": dict(self.retried),
            "in_flight": self.in_flight,
            "awaiting_capture": self.awaiting_capture,
            "tokens": self.tokens,
            "tokens_per_s": round(tok_s, 1),
            "eta_s": None if eta is None else round(eta, 1),
            "paused_reason": self.paused_reason,
            "paused_s": round(self.paused_total_s, 1),
            "paused_for_s": None if (under_way := self.pause_under_way_s()) is None else round(under_way, 1),
            "error": self.error,
            "shard": self.shard.to_json(),
            "attempt": self.attempt,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "updated_at": time.time(),
        }

    def summary(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "samples_total": self.samples_total,
            "dataset_lines": self.dataset_lines,
            "shard": self.shard.to_json(),
            "ok": self.ok,
            "skipped": self.skipped,
            "truncated": self.truncated,
            "failed": dict(self.failed),
            "rejected": dict(self.rejected),
            "retried": dict(self.retried),
            "tokens": self.tokens,
            "wall_s": round(time.monotonic() - self.started, 2),
            "paused_s": round(self.paused_total_s, 1),
            "startup_s": dict(self.startup_s),
            "attempt": self.attempt,
            "finished_at": time.time(),
        }


class Reporter(StatusReporter):
    """The client's status file and progress; logs each pause and the resumption once."""

    def __init__(self, stats: RunStats, output: str | Path, stream: TextIO | None = None,
                 status_every: float = 1.0, log_every: float = 30.0, shard: Shard = WHOLE):
        super().__init__(client_status_path(output, shard), log, stream, status_every, log_every)
        self.stats = stats
        self._last_paused: str | None = None

    def snapshot(self) -> dict[str, Any]:
        return self.stats.snapshot()

    def line(self, snap: dict[str, Any]) -> str:
        return progress_line(snap)

    def fraction_done(self, snap: dict[str, Any]) -> float:
        return (snap["ok"] + snap["skipped"] + snap["failed"] + snap["rejected"]) / max(1, snap["samples_total"])

    def noticed(self, snap: dict[str, Any]) -> None:
        if snap["paused_reason"] != self._last_paused:
            if snap["paused_reason"]:
                log.warning("paused: %s", snap["paused_reason"])
            elif self._last_paused and snap["state"] == "running":
                log.info("resumed sending")  # not when the pause ended because the run did
            self._last_paused = snap["paused_reason"]
