"""How each staged request ends, and the writer's counters of it.

A request ends once: either every planned row is on disk and its ``done.json`` is written
atomically (`RequestOutcomes.slice_done`, after its last slice), or the capture gives up on it
(`RequestOutcomes.fail`: the one way a request fails, whatever the reason: a write error such as
a full /dev/shm, a batch that could not be queued, rows the capture never saw, rows that differ
from the forward pass's, SGLang's placeholder of a refused request). A failed request is logged
with the reason, its partial file is removed to give the space back, it is never marked done,
and ``failed.json`` tells the client why, so the client sends the sample again. Nothing here
raises into the server.

`WriterCounters` travels whole: the writer process sends its counters to the parent with each
flush's answer (`hsextract.capture.wire.Flushed`), and either kind of writer shows them as its
own attributes (`CounterAttributes`).
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from dataclasses import dataclass, replace

from hsextract.capture.core import RequestState
from hsextract.capture.states_file import StatesFileWriter
from hsextract.staging.dumps import (
    CAPTURE_FINGERPRINT,
    CAPTURE_WRITE_ERROR,
    DONE_FILE,
    FAILED_FILE,
    FailureMarker,
    write_done_marker,
    write_failed_marker,
)

log = logging.getLogger("hsextract.capture")


@dataclass
class WriterCounters:
    """What a writer has staged so far."""

    requests_done: int = 0
    requests_failed: int = 0
    write_errors: int = 0  # requests that a failed write lost (not writes: a request has many slices)
    bytes_written: int = 0
    fingerprint_mismatches: int = 0  # slices whose host copy differed from the forward pass's rows


class CounterAttributes:
    """A writer's `WriterCounters` read as its own attributes (``writer.requests_done``), as the
    benches and tests read either kind of writer."""

    @property
    def counters(self) -> WriterCounters:
        raise NotImplementedError

    @property
    def requests_done(self) -> int:
        return self.counters.requests_done

    @property
    def requests_failed(self) -> int:
        return self.counters.requests_failed

    @property
    def write_errors(self) -> int:
        return self.counters.write_errors

    @property
    def bytes_written(self) -> int:
        return self.counters.bytes_written

    @property
    def fingerprint_mismatches(self) -> int:
        return self.counters.fingerprint_mismatches


def write_error(path: str, exc: OSError) -> str:
    """The failure detail of a write of ``path`` that failed with ``exc``."""
    hint = (
        " (/dev/shm is full: the client should pause, or the drain is not keeping up)"
        if exc.errno == errno.ENOSPC
        else ""
    )
    return f"cannot write {path}: {exc.strerror or exc}{hint}"


class RequestOutcomes:
    """Marks requests done or failed in the staging directory, and counts them (thread-safe: the
    writer threads and the dispatcher share one)."""

    def __init__(self, files: StatesFileWriter):
        self.files = files
        self._lock = threading.Lock()  # guards _counters
        self._counters = WriterCounters()
        self._shared_json: str | None = None  # the part of done.json the same for every request

    @property
    def counters(self) -> WriterCounters:
        """A copy of the counters as of now."""
        with self._lock:
            return replace(self._counters)

    def wrote(self, nbytes: int) -> None:
        with self._lock:
            self._counters.bytes_written += nbytes

    def slice_done(self, state: RequestState) -> None:
        """One planned slice of the request is over, written or not: after its last, a complete
        request that did not fail gets its ``done.json``."""
        with state.lock:
            state.pending -= 1
            ready = state.pending == 0 and state.marker is not None and not state.failed and not state.done_written
            if ready:
                state.done_written = True
        if not ready:
            return
        assert state.marker is not None
        try:
            if self._shared_json is None:
                self._shared_json = state.marker.shared_json()
            write_done_marker(self.files.root, state.marker, self._shared_json)
            with self._lock:
                self._counters.requests_done += 1
        except OSError as exc:
            self.fail(state, CAPTURE_WRITE_ERROR, write_error(self.files.path(state.rid, DONE_FILE), exc))

    def fail(self, state: RequestState, reason: str, detail: str) -> None:
        """Once per request: mark it failed, remove its partial rows, leave ``failed.json``."""
        if reason == CAPTURE_FINGERPRINT:
            with self._lock:
                self._counters.fingerprint_mismatches += 1
        with state.lock:
            first = not state.reported
            state.reported = True
            if not state.failed:
                state.failed = reason
        if not first:
            return  # its other slices failed too: one request, one error
        with self._lock:
            self._counters.requests_failed += 1
            if reason == CAPTURE_WRITE_ERROR:
                self._counters.write_errors += 1
        log.error(
            "capture: request %s cannot be staged (%s: %s); it is marked failed for the client to send again",
            state.rid,
            reason,
            detail,
        )
        self.files.discard(state.rid)
        try:
            write_failed_marker(self.files.root, FailureMarker(state.rid, reason, detail, time.time()))
        except OSError as exc:
            # The client's wait for this request then ends in 'capture_missing', and it sends it again.
            log.error(
                "capture: cannot write %s for request %s (%s); the client will find no dump and send it again",
                FAILED_FILE,
                state.rid,
                exc.strerror or exc,
            )
