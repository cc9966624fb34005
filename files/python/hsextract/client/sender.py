"""Send one prefill request per sample to the SGLang server, riding out restarts and transient errors.

The client runs for days against a server that systemd may restart (a crash, an OOM, a deploy),
and a 1T-parameter model takes ~12 minutes to load. So a refused connection is not a sample's
fault: the sender waits for ``/health`` (one thread polls, the others wait on it) and tries the
sample again. Only errors that persist while the server is healthy use up a sample's attempts;
a sample that runs out of them is reported failed with the last reason, and the run goes on.
4xx answers (the server refuses this sample) fail at once: sending it again cannot help.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests

from hsextract.errors import HsextractError

log = logging.getLogger(__name__)

# Failure reason codes (counted in the summary).
HTTP_4XX = "http_4xx"
SERVER_ERROR = "server_error"
CONNECTION = "connection_error"
TIMEOUT = "timeout"
BAD_RESPONSE = "bad_response"
PROMPT_TOKENS_MISMATCH = "prompt_tokens_mismatch"
ABORTED = "aborted"
# Not a failure: the client was asked to stop before the sample had an answer. The next run sends it.
STOPPED = "stopped"


class ServerUnavailable(HsextractError):
    """The server did not become healthy within the configured wait."""

    exit_code = 75  # EX_TEMPFAIL: systemd may restart the client once the server is back


class StopRequested(Exception):
    """The client was asked to stop while waiting for the server: not an error, the run just ends."""


@dataclass
class SendResult:
    ok: bool
    prompt_tokens: int = 0
    reason: str = ""
    detail: str = ""
    attempts: int = 0


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0  # a long prompt may queue behind many others
    server_wait_s: float = 3600.0  # how long a down server is waited for before the run gives up

    def delay(self, attempt: int) -> float:
        return min(self.backoff_max_s, self.backoff_s * (2 ** max(0, attempt - 1)))


class HealthGate:
    """Waits until the server answers ``GET /health`` with 200; one poller at a time."""

    def __init__(self, base_url: str, policy: RetryPolicy, stop: threading.Event | None = None):
        self.base_url = base_url.rstrip("/")
        self.policy = policy
        self.stop = stop or threading.Event()
        self._lock = threading.Lock()
        self._healthy_at = 0.0
        self._count_lock = threading.Lock()
        self.waiting = 0  # threads blocked on a down server, shown in the status
        self.down_since: float | None = None

    def probe(self) -> bool:
        try:
            resp = requests.get(f"{self.base_url}/health", timeout=(self.policy.connect_timeout_s, 30))
            return resp.status_code == 200
        except requests.RequestException:
            return False

    def wait_healthy(self, since: float) -> None:
        """Block until the server was seen healthy after time `since`; raise ServerUnavailable on
        timeout, StopRequested if the client is asked to stop meanwhile."""
        with self._count_lock:
            self.waiting += 1
        try:
            with self._lock:
                if self._healthy_at > since:
                    return
                deadline = time.monotonic() + self.policy.server_wait_s
                delay = 0.5
                while not self.stop.is_set():
                    if self.probe():
                        self._healthy_at = time.monotonic()
                        if self.down_since is not None:
                            down_s = time.time() - self.down_since
                            log.warning("server %s is healthy again after %.0f s", self.base_url, down_s)
                        self.down_since = None
                        return
                    if self.down_since is None:
                        self.down_since = time.time()
                        log.warning("server %s is not answering; waiting for /health", self.base_url)
                    if time.monotonic() > deadline:
                        raise ServerUnavailable(
                            f"server {self.base_url} has not answered /health for {self.policy.server_wait_s:.0f} s; "
                            "check the SGLang service (journalctl -u the server unit), then restart the client"
                        )
                    self.stop.wait(delay)
                    delay = min(5.0, delay * 1.5)
                raise StopRequested(f"asked to stop while waiting for {self.base_url}/health")
        finally:
            with self._count_lock:
                self.waiting -= 1


class Sender:
    """POSTs samples to ``/generate`` as 1-token greedy prefills; thread-safe (a session per thread)."""

    def __init__(self, base_url: str, policy: RetryPolicy | None = None, stop: threading.Event | None = None):
        self.base_url = base_url.rstrip("/")
        self.policy = policy or RetryPolicy()
        self.stop = stop or threading.Event()
        self.gate = HealthGate(self.base_url, self.policy, self.stop)
        self._local = threading.local()

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    @staticmethod
    def payload(rid: str, input_ids: list[int]) -> dict[str, Any]:
        return {"input_ids": input_ids, "rid": rid, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}

    def send(self, rid: str, input_ids: list[int]) -> SendResult:
        """Send one sample until it succeeds, fails for good, or the server stays down (ServerUnavailable).

        A stop request ends it with reason `STOPPED` (never a failure): at once while the server
        is down or between attempts; a request already on the wire is answered first.
        """
        try:
            return self._send(rid, input_ids)
        except StopRequested:
            return SendResult(False, reason=STOPPED, detail="the client was asked to stop first")

    def _send(self, rid: str, input_ids: list[int]) -> SendResult:
        reason, detail = "", ""
        attempt = 0
        while attempt < self.policy.max_attempts:
            attempt += 1
            started = time.monotonic()
            try:
                resp = self._session().post(
                    f"{self.base_url}/generate",
                    json=self.payload(rid, input_ids),
                    timeout=(self.policy.connect_timeout_s, self.policy.read_timeout_s),
                )
            except requests.ConnectionError as exc:
                reason, detail = CONNECTION, str(exc)[:200]
                self._session().close()
                self.gate.wait_healthy(started)
                continue
            except requests.Timeout as exc:
                reason, detail = TIMEOUT, str(exc)[:200]
                continue
            except requests.RequestException as exc:
                reason, detail = CONNECTION, f"{type(exc).__name__}: {str(exc)[:200]}"
                self.gate.wait_healthy(started)
                continue
            if resp.status_code == 200:
                result = self._check(resp, len(input_ids), attempt)
                if result.reason != ABORTED:
                    return result
                reason, detail = result.reason, result.detail  # the server gave up on it: try again
                if self.stop.wait(self.policy.delay(attempt)):
                    raise StopRequested
                continue
            detail = f"HTTP {resp.status_code}: {resp.text[:200]}"
            if 400 <= resp.status_code < 500 and resp.status_code not in (408, 429):
                return SendResult(False, reason=HTTP_4XX, detail=detail, attempts=attempt)
            reason = SERVER_ERROR
            if self.stop.wait(self.policy.delay(attempt)):
                raise StopRequested
        return SendResult(False, reason=reason or CONNECTION, detail=detail, attempts=attempt)

    @staticmethod
    def _check(resp: requests.Response, n_tokens: int, attempt: int) -> SendResult:
        try:
            meta = resp.json()["meta_info"]
            finish = meta.get("finish_reason")
            if isinstance(finish, dict) and finish.get("type") == "abort":
                return SendResult(False, reason=ABORTED, detail=f"server aborted it: {finish}"[:300], attempts=attempt)
            prompt_tokens = int(meta["prompt_tokens"])
        except (ValueError, KeyError, TypeError) as exc:
            detail = f"no meta_info.prompt_tokens ({exc})"
            return SendResult(False, reason=BAD_RESPONSE, detail=detail, attempts=attempt)
        if prompt_tokens != n_tokens:
            return SendResult(
                False, prompt_tokens, PROMPT_TOKENS_MISMATCH,
                f"server ran {prompt_tokens} prompt tokens, client sent {n_tokens}", attempt,
            )
        return SendResult(True, prompt_tokens, attempts=attempt)
