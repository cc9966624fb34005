"""Progress of the drain: counters, the status file `hsextract status` reads, Prometheus text.

The status file (hsextract.output.run_files.DrainStatus) is rewritten atomically every few seconds
(``updated_at`` tells a reader whether the daemon is alive); the metrics endpoint is optional and
binds to 127.0.0.1 only.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hsextract.output.run_files import DrainStatus, write_drain_status

log = logging.getLogger(__name__)

RATE_WINDOW_S = 30.0


@dataclass
class DrainStats:
    """Counters shared by the drain's threads (every update under one lock)."""

    format: str = ""
    precision: str = ""
    run_id: str = ""
    samples: int = 0  # written by this process
    tokens: int = 0
    bytes: int = 0
    samples_total: int = 0  # in the manifest, including earlier runs of the daemon
    tokens_total: int = 0  # ... and their tokens and file bytes
    bytes_total: int = 0
    quarantined: Counter = field(default_factory=Counter)
    stale_removed: Counter = field(default_factory=Counter)
    lag: int = 0  # complete dumps of this run waiting in staging
    foreign: dict = field(default_factory=dict)  # dumps of other runs in staging, left alone: owner -> count
    accounts: dict = field(default_factory=dict)  # the run's reconciliation, once it has finished
    selfcheck: dict = field(default_factory=dict)  # the self-check's counts (hsextract.drain.selfcheck)
    # The client summaries (hsextract.output.client_files.summary_id) of the last run a drain of this output
    # finished with --exit-when-done: kept from drain to drain, so a later one never takes them for
    # the end of a new run.
    finished_client_runs: list = field(default_factory=list)
    in_flight: int = 0
    finalized_samples: int | None = None  # the samples the dataset-level files were last written for
    finalize_problem: str = ""  # why they lag behind the manifest, when the drain stops with them behind
    paused_reason: str = ""
    # Where the set goes when it is a bucket (hsextract.objectstore): the URL, segments published,
    # since when the server does not answer (0: it answers). Never a credential.
    objectstore: dict = field(default_factory=dict)
    state: str = "starting"
    started_at: float = field(default_factory=time.time)
    _recent: deque = field(default_factory=deque)  # (time, samples, tokens, bytes)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_written(self, samples: int, tokens: int, nbytes: int) -> None:
        with self._lock:
            self.samples += samples
            self.samples_total += samples
            self.tokens += tokens
            self.tokens_total += tokens
            self.bytes += nbytes
            self.bytes_total += nbytes
            now = time.time()
            self._recent.append((now, samples, tokens, nbytes))
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()

    def add_quarantined(self, reason: str) -> None:
        with self._lock:
            self.quarantined[reason] += 1

    def add_stale(self, why: str) -> None:
        with self._lock:
            self.stale_removed[why] += 1

    def set(self, **kwargs: Any) -> None:
        with self._lock:
            for k, v in kwargs.items():
                setattr(self, k, v)

    def status(self) -> DrainStatus:
        """The status file's record, now (the caller adds what the stats do not hold: `write_status`)."""
        with self._lock:
            now = time.time()
            recent = [r for r in self._recent if r[0] >= now - RATE_WINDOW_S]
            span = min(RATE_WINDOW_S, max(now - self.started_at, 1e-3))
            return DrainStatus(
                state=self.state,
                format=self.format,
                precision=self.precision,
                run_id=self.run_id,
                samples=self.samples,
                samples_total=self.samples_total,
                tokens=self.tokens,
                tokens_total=self.tokens_total,
                bytes=self.bytes,
                bytes_total=self.bytes_total,
                samples_per_s=round(sum(r[1] for r in recent) / span, 3),
                tokens_per_s=round(sum(r[2] for r in recent) / span, 1),
                mb_per_s=round(sum(r[3] for r in recent) / span / 1e6, 2),
                lag=self.lag,
                foreign=dict(self.foreign),
                accounts=dict(self.accounts),
                selfcheck=dict(self.selfcheck),
                finished_client_runs=list(self.finished_client_runs),
                in_flight=self.in_flight,
                finalized_samples=self.finalized_samples,
                finalize_problem=self.finalize_problem,
                quarantined=sum(self.quarantined.values()),
                quarantined_by_reason=dict(self.quarantined),
                stale_removed=sum(self.stale_removed.values()),
                stale_removed_by_reason=dict(self.stale_removed),
                paused_reason=self.paused_reason,
                objectstore=dict(self.objectstore) if self.objectstore else None,
                started_at=self.started_at,
                updated_at=now,
            )

    def snapshot(self) -> dict[str, Any]:
        """The status file's object, now (the metrics endpoint serves it)."""
        return self.status().to_json()


def write_status(output_dir: str | Path, stats: DrainStats, **extra: Any) -> None:
    """The status file, from the stats and `extra` (the process's pid, its directories, its error:
    fields of hsextract.output.run_files.DrainStatus)."""
    write_drain_status(output_dir, dataclasses.replace(stats.status(), **extra))


def _n(value: float | None) -> float:
    """A number of the status as exposed: 0 where it has none."""
    return 0 if value is None else value


def prometheus_text(status: DrainStatus) -> str:
    """The status as Prometheus text exposition (version 0.0.4)."""
    lines = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP hsextract_drain_{name} {help_}")
        lines.append(f"# TYPE hsextract_drain_{name} {kind}")
        for labels, value in samples:
            lines.append(f"hsextract_drain_{name}{labels} {value}")

    def by_reason(counts: dict[str, int] | None) -> list[tuple[str, float]]:
        return [(f'{{reason="{r}"}}', n) for r, n in sorted((counts or {}).items())] or [("", 0)]

    metric("samples_total", "counter", "Samples written by this process.", [("", _n(status.samples))])
    metric("manifest_samples", "gauge", "Samples in the output manifest.", [("", _n(status.samples_total))])
    metric("tokens_total", "counter", "Tokens written by this process.", [("", _n(status.tokens))])
    metric("bytes_total", "counter", "Bytes written by this process.", [("", _n(status.bytes))])
    metric("lag_dumps", "gauge", "Complete dumps waiting in staging.", [("", _n(status.lag))])
    metric("in_flight", "gauge", "Dumps being validated or written.", [("", _n(status.in_flight))])
    metric("quarantined_total", "counter", "Dumps quarantined, by reason.", by_reason(status.quarantined_by_reason))
    metric(
        "stale_removed_total", "counter", "Stale dumps removed, by reason.", by_reason(status.stale_removed_by_reason)
    )
    paused = int(bool(status.paused_reason))
    window = f"{RATE_WINDOW_S:.0f} s"
    metric("paused", "gauge", "1 while the drain waits (e.g. the output volume is full).", [("", paused)])
    metric("samples_per_second", "gauge", f"Write rate over the last {window}.", [("", _n(status.samples_per_s))])
    metric("tokens_per_second", "gauge", f"Token rate over the last {window}.", [("", _n(status.tokens_per_s))])
    metric("last_update_timestamp_seconds", "gauge", "Time of this snapshot.", [("", _n(status.updated_at))])
    return "\n".join(lines) + "\n"


class MetricsServer:
    """Serves ``GET /metrics`` on 127.0.0.1:`port` from a daemon thread."""

    def __init__(self, stats: DrainStats, port: int, host: str = "127.0.0.1"):
        stats_ref = stats

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = prometheus_text(stats_ref.status()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("metrics: " + format, *args)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="drain-metrics", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
