"""What the HTTP runs (`hsextract extract`, `hsextract regenerate`) share in showing their progress.

Both keep a rate over the last minute of answers and a status file rewritten every second, show a
live bar on a terminal and a log line every few tens of seconds in a journal. The runs differ only
in their counters and their line, so each gives those and the rest is written once here.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Generic, TextIO, TypeVar

from hsextract.durable import atomic_write_json

S = TypeVar("S")  # a run's snapshot of its counters

RATE_WINDOW_S = 60.0
BAR_WIDTH = 24


class RateWindow:
    """Tokens and items per second over the last minute of answers, or since the start when shorter.

    Not thread-safe on its own: the run appends under its counters' lock.
    """

    def __init__(self, started: float, maxlen: int = 600):
        self.started = started
        self._points: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=maxlen)

    def add(self, tokens: int, items: int) -> None:
        """The run's totals after an answer."""
        self._points.append((time.monotonic(), tokens, items))

    def rates(self, tokens: int, items: int) -> tuple[float, float]:
        """(tokens/s, items/s); ``tokens`` and ``items``: the run's totals, for the rate since the start."""
        now = time.monotonic()
        win = [p for p in self._points if now - p[0] <= RATE_WINDOW_S]
        if len(win) >= 2 and win[-1][0] > win[0][0]:
            dt = max(now - win[0][0], 1e-6)
            return (win[-1][1] - win[0][1]) / dt, (win[-1][2] - win[0][2]) / dt
        elapsed = max(now - self.started, 1e-6)
        return tokens / elapsed, items / elapsed


class StatusReporter(Generic[S]):
    """Writes the status file every `every` s and shows progress (a bar on a TTY, else log lines).

    A run's reporter gives `snapshot` (its counters), `line` (one line of progress) and
    `fraction_done`; `noticed` sees each snapshot first (the client logs its pauses there);
    `write` writes it (as JSON, unless the run's status file has a writer of its own).
    """

    thread_name = "hsextract-progress"

    def __init__(
        self,
        status_path: Path,
        log: logging.Logger,
        stream: TextIO | None = None,
        every: float = 1.0,
        log_every: float = 30.0,
    ):
        self.status_path = status_path
        self.log = log
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = every
        self.log_every = log_every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_log = 0.0

    def snapshot(self) -> S:
        raise NotImplementedError

    def write(self, snap: S) -> None:
        atomic_write_json(self.status_path, snap)

    def line(self, snap: S) -> str:
        raise NotImplementedError

    def fraction_done(self, snap: S) -> float:
        raise NotImplementedError

    def noticed(self, snap: S) -> None:
        """Called with every snapshot before it is shown."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.tick()

    def tick(self) -> None:
        snap = self.snapshot()
        self.write(snap)
        self.noticed(snap)
        if self.tty:
            filled = int(BAR_WIDTH * min(1.0, self.fraction_done(snap)))
            self.stream.write(f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.line(snap)}\x1b[K")
            self.stream.flush()
        elif time.monotonic() - self._last_log >= self.log_every:
            self._last_log = time.monotonic()
            self.log.info("%s", self.line(snap))

    def stop(self, final_tick: bool = True) -> None:
        """Stop reporting; ``final_tick``: write the last status (else the caller writes it)."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        if not final_tick:
            return
        self.tick()
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
