"""Counters of a regeneration run and the ways they are shown: status file, progress bar, log lines, summary.

As for ``hsextract extract``: the status file (``<output>/.hsextract/regen-status.json``) is
rewritten every second, a terminal gets a live bar, a journal gets a line every few tens of
seconds, and the summary is written only by a run that has an outcome for every conversation.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from hsextract.run_progress import RateWindow, StatusReporter

log = logging.getLogger("hsextract.regen")


@dataclass
class RegenStats:
    conversations_total: int = 0  # rows of this shard
    ok: int = 0  # written to the regenerated dataset this run
    skipped: int = 0  # already done by an earlier run
    failed: Counter = field(default_factory=Counter)  # by reason, written to the errors file
    cut: Counter = field(default_factory=Counter)  # written, but cut before their end, by reason
    truncated: int = 0  # replies written that hit the token limit
    turns: int = 0  # replies regenerated and written
    completion_tokens: int = 0
    in_flight: int = 0
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    state: str = "running"
    error: str = ""
    started: float = field(default_factory=time.monotonic)
    started_at: float = field(default_factory=time.time)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _window: RateWindow = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._window = RateWindow(self.started)

    @property
    def done(self) -> int:
        return self.ok + self.skipped + sum(self.failed.values())

    def record_ok(self, turns: int, tokens: int, truncated: int, cut_reason: str | None) -> None:
        with self.lock:
            self.ok += 1
            self.turns += turns
            self.completion_tokens += tokens
            self.truncated += truncated
            if cut_reason:
                self.cut[cut_reason] += 1
            self._window.add(self.completion_tokens, self.ok)

    def record_failed(self, reason: str, tokens: int = 0) -> None:
        with self.lock:
            self.failed[reason] += 1
            self.completion_tokens += tokens

    def rates(self) -> tuple[float, float]:
        """(completion tokens/s, conversations/s) over the last minute, or since the start if shorter."""
        return self._window.rates(self.completion_tokens, self.ok)

    def snapshot(self) -> dict[str, Any]:
        """The counters as one consistent copy (the status thread reads them while the run updates them)."""
        with self.lock:
            failed, cut = dict(self.failed), dict(self.cut)
            servers = {url: dict(info) for url, info in self.servers.items()}
            done = self.done
            tok_s, conv_s = self.rates()
        remaining = max(0, self.conversations_total - done)
        return {
            "state": self.state,
            "conversations_total": self.conversations_total,
            "done": done,
            "ok": self.ok,
            "skipped": self.skipped,
            "failed": sum(failed.values()),
            "failed_by_reason": failed,
            "cut_by_reason": cut,
            "truncated": self.truncated,
            "turns": self.turns,
            "completion_tokens": self.completion_tokens,
            "tokens_per_s": round(tok_s, 1),
            "in_flight": self.in_flight,
            "eta_s": round(remaining / conv_s, 1) if conv_s > 0 else None,
            "servers": servers,
            "error": self.error,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "updated_at": time.time(),
        }

    def summary(self) -> dict[str, Any]:
        """What this run did: the whole regeneration's counts are its files' (`hsextract.regen.totals`)."""
        return {
            "ok": self.ok,
            "skipped": self.skipped,
            "failed": dict(self.failed),
            "cut": dict(self.cut),
            "truncated": self.truncated,
            "turns": self.turns,
            "completion_tokens": self.completion_tokens,
            "wall_s": round(time.monotonic() - self.started, 2),
        }


def _eta(eta: float | None) -> str:
    if eta is None:
        return "--"
    h, rem = divmod(int(eta), 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def progress_line(snap: dict[str, Any]) -> str:
    return (
        f"{snap['done']}/{snap['conversations_total']} conversations | ok {snap['ok']} skipped {snap['skipped']} "
        f"failed {snap['failed']} | {snap['turns']} turns, {snap['tokens_per_s']:.0f} tok/s | "
        f"in flight {snap['in_flight']} | ETA {_eta(snap['eta_s'])}"
    )


class Reporter(StatusReporter[dict[str, Any]]):
    """The regeneration's status file and progress."""

    thread_name = "hsextract-regen-progress"

    def __init__(
        self,
        stats: RegenStats,
        status_path: Path,
        stream: TextIO | None = None,
        every: float = 1.0,
        log_every: float = 30.0,
    ):
        super().__init__(status_path, log, stream, every, log_every)
        self.stats = stats

    def snapshot(self) -> dict[str, Any]:
        return self.stats.snapshot()

    def line(self, snap: dict[str, Any]) -> str:
        return progress_line(snap)

    def fraction_done(self, snap: dict[str, Any]) -> float:
        return snap["done"] / max(1, snap["conversations_total"])
