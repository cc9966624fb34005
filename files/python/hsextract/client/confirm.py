"""Wait for the capture's word on each sample the server answered: staged, failed, or nothing.

A 200 from ``/generate`` says the server ran the prompt, not that the capture staged its rows:
the writer works after the forward pass, and it can fail (a full /dev/shm, a batch it could not
queue, rows it never saw). So the client keeps each answered sample open until its dump tells:

* ``<rid>/done.json`` exists, or the client's record of it is gone (the drain took the dump
  already and removed the record, or quarantined it): `Outcome.STAGED`;
* ``<rid>/failed.json`` exists: `Outcome.FAILED`, with the capture's reason;
* neither within the timeout: `Outcome.MISSING` (the capture of another directory, a dead
  writer, a failure marker that could not be written).

The client sends a failed or missing sample again, up to its attempt limit, and then reports it
in failures.jsonl with reason ``capture_failed`` or ``capture_missing``. One thread looks at
every open sample in turn, a few stat calls each, so thousands of open samples cost little.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hsextract.staging.dumps import DONE_FILE, FAILED_FILE, read_failed_marker, rid_dir
from hsextract.staging.records import record_path
from hsextract.units import duration

log = logging.getLogger("hsextract.client")

CAPTURE_FAILED = "capture_failed"
CAPTURE_MISSING = "capture_missing"


class Outcome(enum.Enum):
    STAGED = "staged"
    FAILED = "failed"
    MISSING = "missing"


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    detail: str = ""


def look(dump_dir: Path, rid: str, waited_s: float, timeout_s: float) -> Verdict | None:
    """The capture's word on `rid` so far, or None while it may still come."""
    d = rid_dir(dump_dir, rid)
    if (d / DONE_FILE).exists():
        return Verdict(Outcome.STAGED)
    if (d / FAILED_FILE).exists():
        marker = read_failed_marker(d)
        detail = f"{marker.reason}: {marker.detail}" if marker else "failed.json"
        return Verdict(Outcome.FAILED, detail)
    if not record_path(dump_dir, rid).exists():
        return Verdict(Outcome.STAGED)  # drained (or quarantined) already: the drain removed the record
    if waited_s > timeout_s:
        return Verdict(
            Outcome.MISSING, f"no {DONE_FILE} or {FAILED_FILE} in {d} {duration(waited_s)} after the server answered"
        )
    return None


def capture_has_word(dump_dir: Path, rid: str) -> bool:
    """Whether the capture has said what became of `rid` (`look`): the sender asks when the server
    still holds an earlier send of it (hsextract.client.sender)."""
    try:
        return look(Path(dump_dir), rid, 0.0, float("inf")) is not None
    except OSError:
        return False


class CaptureWatch:
    """Calls ``on_verdict(rid, verdict)`` once for each rid handed to `expect`, from its own thread
    (running from `start` to `close`)."""

    def __init__(
        self, dump_dir: str | Path, timeout_s: float, on_verdict: Callable[[str, Verdict], None], poll_s: float = 0.05
    ):
        self.dump_dir = Path(dump_dir)
        self.timeout_s = timeout_s
        self.on_verdict = on_verdict
        self.poll_s = poll_s
        self._open: dict[str, float] = {}  # rid -> time the server answered
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hsextract-capture-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def expect(self, rid: str) -> None:
        with self._lock:
            self._open[rid] = time.monotonic()

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            with self._lock:
                items = list(self._open.items())
            now = time.monotonic()
            for rid, since in items:
                try:
                    verdict = look(self.dump_dir, rid, now - since, self.timeout_s)
                except OSError as exc:
                    verdict = Verdict(Outcome.MISSING, f"cannot look at the dump of {rid}: {exc}")
                if verdict is None:
                    continue
                with self._lock:
                    self._open.pop(rid, None)
                try:
                    self.on_verdict(rid, verdict)
                except Exception:  # a bug must not stop the watch for every other sample
                    log.exception("handling the capture verdict for %s failed", rid)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
