"""The samples the drain has in hand: submitted to the workers and not yet settled.

A sample is in hand from its submission until it is settled: written, dropped as a second dump
of a written sample, or quarantined. Of those, the ones a worker has not finished preparing hold
a slot of the queue, whose bound keeps the scan from submitting every staged dump at once;
prepared samples wait for the committer without a slot, so its directory fsyncs never leave the
workers idle. Freeing a slot, settling a sample or stopping wakes the scan at once instead of
after its poll interval.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class InFlight:
    """Thread-safe: the scan submits, the workers prepare, the committer settles."""

    def __init__(self, max_preparing: int):
        self.max_preparing = max_preparing
        self.wake = threading.Event()  # set when a slot frees or a sample settles (or on stop)
        self.last_activity = time.monotonic()  # when a sample was last submitted or written
        self._rids: set[str] = set()
        self._preparing = 0
        self._lock = threading.Lock()

    def __contains__(self, rid: str) -> bool:
        with self._lock:
            return rid in self._rids

    def __len__(self) -> int:
        with self._lock:
            return len(self._rids)

    def idle(self) -> bool:
        """No sample in hand."""
        with self._lock:
            return not self._rids

    def full(self) -> bool:
        with self._lock:
            return self._preparing >= self.max_preparing

    def add(self, rid: str) -> bool:
        """Take a queue slot for `rid`; False (nothing taken) when the queue is full."""
        with self._lock:
            if self._preparing >= self.max_preparing:
                return False
            self._rids.add(rid)
            self._preparing += 1
        return True

    def prepare(self, rid: str, work: Callable[[], None]) -> None:
        """Run `work` (a worker's preparation of `rid`) in its slot, then free the slot; a sample
        whose preparation raised is no longer in hand."""
        try:
            try:
                work()
            except BaseException:
                with self._lock:
                    self._rids.discard(rid)
                raise
        finally:
            with self._lock:
                self._preparing -= 1
            self.wake.set()

    def settled(self, rid: str) -> None:
        """`rid` left the drain's hands (written, dropped or quarantined)."""
        with self._lock:
            self._rids.discard(rid)
        self.wake.set()  # the main loop may be waiting for the last sample to leave

    def touch(self) -> None:
        """Something happened: the idle time before a finalize starts again."""
        self.last_activity = time.monotonic()
