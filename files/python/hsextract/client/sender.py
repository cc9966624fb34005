"""Send one prefill request per sample to the SGLang server, riding out restarts and transient errors.

The client runs for days against a server that systemd may restart (a crash, an OOM, a deploy),
and a 1T-parameter model takes ~12 minutes to load. So a refused connection is not a sample's
fault: the sender waits for ``/health`` (one thread polls, the others wait on it) and tries the
sample again. Only errors that persist while the server is healthy use up a sample's attempts;
a sample that runs out of them is reported failed with the last reason, and the run goes on.
4xx answers (the server refuses this sample) fail at once: sending it again cannot help.

A request the server has not answered within ``--request-timeout`` is not given up while the server
is healthy: SGLang aborts a request whose connection closes (and, since it matches rids by prefix,
every queued request whose rid extends it), so closing it would throw the queued work away and a
resend would wait in the same queue. The sender asks ``/health`` instead and keeps waiting on the
same connection; only a server that is not healthy, or a request unanswered for ``--server-wait``,
costs an attempt and is sent again once the server is back. A resend that meets SGLang's
``Duplicate request ID`` answer is not a refusal either: the server still holds an earlier send of
the same rid (a connection lost while the server kept the request, a client restarted within
SGLang's few seconds of noticing the old one's disconnect). The sender waits for that send, looking
at the capture's staging meanwhile (`settled`): once the earlier send staged its dump, or failed it,
the sample is handed to the capture watch as answered; once the server lets the rid go, it is sent
again. The rid stays one per sample, so the two sends can never make two dumps that both enter the
training set: they share one staging directory, and the drain drops a second dump of a written
sample.

The requests go out on ``http.client`` connections kept open per sender thread, with the body
encoded by the standard library's C JSON encoder: ``requests`` spent 1.6 ms of CPU a request on
a 2-core machine against 0.3-0.4 ms this way (the proxy settings read from the environment, the
pure-Python JSON encoding of the ids), and one client process runs everything under one GIL
(`docs/benchmarks.md`, the client's ceiling).
"""

from __future__ import annotations

import functools
import http.client
import json
import logging
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests

from hsextract.errors import HsextractError
from hsextract.retry import RetryPolicy
from hsextract.units import duration

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
# SGLang's answer (HTTP 400) to a rid it still holds from an earlier send (tokenizer_manager.py).
DUPLICATE_RID = "Duplicate request ID"
# How long the sender waits between sends of a rid the server still holds (doubling up to the second).
HELD_POLL_S = (0.2, 2.0)


def _no_answer(exc: BaseException) -> tuple[str, str]:
    """The reason and detail of a request that got no answer."""
    if isinstance(exc, ConnectFailed):
        return CONNECTION, str(exc)[:200]
    if isinstance(exc, TimeoutError):
        return TIMEOUT, f"no answer from a server that is not healthy ({exc})"[:200]
    return CONNECTION, f"{type(exc).__name__}: {str(exc)[:200]}"


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
        self._probe_lock = threading.Lock()
        self._probed_ok_at = -float("inf")

    def probe(self) -> bool:
        """True when ``GET /health`` answers 200. SGLang answers it only after a one-token
        generation it polls for once a second, so it takes at least a second even when idle."""
        return self._answers("/health")

    def up_now(self) -> bool:
        """True when ``GET /server_info`` answers 200: the server is up and serving, known in
        milliseconds. The client's start asks this first and waits on /health only when it fails."""
        return self._answers("/server_info")

    def _answers(self, path: str) -> bool:
        try:
            resp = requests.get(f"{self.base_url}{path}", timeout=(self.policy.connect_timeout_s, 30))
            return resp.status_code == 200
        except requests.RequestException:
            return False

    def healthy_now(self, max_age_s: float) -> bool:
        """`probe`, shared: a probe that answered 200 less than `max_age_s` ago is taken as the
        answer, and one thread probes at a time, so many requests waiting at once ask once."""
        with self._probe_lock:
            if time.monotonic() - self._probed_ok_at < max_age_s:
                return True
            ok = self.probe()
            if ok:
                self._probed_ok_at = time.monotonic()
            return ok

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
                            f"server {self.base_url} has not answered /health for "
                            f"{duration(self.policy.server_wait_s)}; "
                            "check the SGLang service (journalctl -u the server unit), then restart the client"
                        )
                    self.stop.wait(delay)
                    delay = min(5.0, delay * 1.5)
                raise StopRequested(f"asked to stop while waiting for {self.base_url}/health")
        finally:
            with self._count_lock:
                self.waiting -= 1


class _Answer:
    """An HTTP answer read whole: its status and body."""

    def __init__(self, status: int, body: bytes):
        self.status_code = status
        self.body = body

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


class ConnectFailed(OSError):
    """The connection to the server could not be made (refused, unreachable, timed out)."""


class _Connection:
    """One kept-open HTTP/1.1 connection to the server (one per sender thread)."""

    def __init__(self, base_url: str, policy: RetryPolicy):
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise HsextractError(f"server URL {base_url!r}: expected http://HOST:PORT or https://HOST:PORT")
        self._cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        self._host, self._port, self._prefix = url.hostname, url.port, url.path.rstrip("/")
        self._policy = policy
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _open(self) -> http.client.HTTPConnection:
        """The kept-open connection, or a new one when there is none or the server closed it while
        idle (its keep-alive timeout): a readable idle socket is one the server has closed."""
        conn = self._conn
        if conn is not None and conn.sock is not None and select.select([conn.sock], [], [], 0)[0]:
            self.close()
            conn = None
        if conn is None or conn.sock is None:
            conn = self._cls(self._host, self._port, timeout=self._policy.connect_timeout_s)
            try:
                conn.connect()
            except OSError as exc:
                conn.close()
                raise ConnectFailed(f"cannot connect to {self._host}:{self._port}: {exc}") from exc
            assert conn.sock is not None
            conn.sock.settimeout(self._policy.read_timeout_s)
            self._conn = conn
        return conn

    def post_json(
        self, path: str, body: dict[str, Any], still_running: Callable[[float], bool] | None = None
    ) -> _Answer:
        """POST ``body`` as JSON and read the whole answer; OSError or HTTPException on failure
        (the connection is closed then).

        Each time ``read_timeout_s`` passes without an answer, ``still_running(seconds waited)``
        says whether to wait on (the server still runs the request); without it, or when it says
        no, TimeoutError.

        A kept-open connection the server closes just as the request goes out (its keep-alive
        timeout, a race the readability check cannot close) answers nothing: the request goes out
        once more on a new connection, as any client of a keep-alive server does, and costs the
        sample none of its attempts. A resend reaches the server as the sender's own retries do."""
        data = json.dumps(body, separators=(",", ":")).encode()
        reused = self._conn is not None
        try:
            return self._exchange(path, data, still_running)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            if not reused:
                raise
        return self._exchange(path, data, still_running)

    def _exchange(self, path: str, data: bytes, still_running: Callable[[float], bool] | None) -> _Answer:
        conn = self._open()
        try:
            conn.request("POST", self._prefix + path, body=data, headers={"Content-Type": "application/json"})
            self._await_answer(conn, still_running)
            resp = conn.getresponse()
            answer = _Answer(resp.status, resp.read())
        except BaseException:
            self.close()
            raise
        if resp.will_close:
            self.close()
        return answer

    def _await_answer(self, conn: http.client.HTTPConnection, still_running: Callable[[float], bool] | None) -> None:
        """Return once the answer starts to arrive; TimeoutError when a read timeout passed and
        `still_running` does not say to wait on. Nothing of the answer is read here, so
        ``getresponse`` reads it whole afterwards (an SSL socket holds no data before it does)."""
        assert conn.sock is not None
        started = time.monotonic()
        timeout = self._policy.read_timeout_s
        while not select.select([conn.sock], [], [], timeout)[0]:
            waited = time.monotonic() - started
            if still_running is None or not still_running(waited):
                raise TimeoutError(f"no answer within {duration(waited)}")


class Sender:
    """POSTs samples to ``/generate`` as 1-token greedy prefills; thread-safe (a connection per thread)."""

    def __init__(
        self,
        base_url: str,
        policy: RetryPolicy | None = None,
        stop: threading.Event | None = None,
        settled: Callable[[str], bool] | None = None,
    ):
        """`settled(rid)`: whether the capture has its word on `rid` already (a dump staged or
        failed, or taken by the drain): a send the server still holds is then answered for the
        client's purpose, and the capture watch takes it from there."""
        self.base_url = base_url.rstrip("/")
        self.policy = policy or RetryPolicy()
        self.stop = stop or threading.Event()
        self.settled = settled or (lambda rid: False)
        self.gate = HealthGate(self.base_url, self.policy, self.stop)
        self._local = threading.local()
        _Connection(self.base_url, self.policy)  # a malformed URL stops the run here, not in every thread

    def _connection(self) -> _Connection:
        c = getattr(self._local, "connection", None)
        if c is None:
            c = self._local.connection = _Connection(self.base_url, self.policy)
        return c

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
        held_since: float | None = None  # since when the server answers that it holds an earlier send
        while attempt < self.policy.max_attempts:
            attempt += 1
            started = time.monotonic()
            try:
                resp = self._connection().post_json(
                    "/generate", self.payload(rid, input_ids), functools.partial(self._still_running, rid)
                )
            except (OSError, http.client.HTTPException) as exc:  # refused, reset, closed mid-answer, timed out
                reason, detail = _no_answer(exc)
                self.gate.wait_healthy(started)
                continue
            if resp.status_code == 400 and DUPLICATE_RID in resp.text:
                held_since = held_since if held_since is not None else self._held_from(rid)
                result = self._held(rid, len(input_ids), attempt, held_since)
                if result is not None:
                    return result
                if time.monotonic() - held_since < self.policy.read_timeout_s:
                    attempt -= 1  # not a try of this sample: the server still runs its earlier one
                    continue
                reason, held_since = TIMEOUT, None
                detail = (
                    f"the server still held an earlier send of {rid} after {duration(self.policy.read_timeout_s)} "
                    f"(HTTP {resp.status_code}: {resp.text[:200]})"
                )[:300]
                continue
            result = self._answered(resp, len(input_ids), attempt)
            if result.reason not in (ABORTED, SERVER_ERROR):
                return result
            reason, detail = result.reason, result.detail  # the server gave up on it, or erred: try again
            if self.stop.wait(self.policy.delay(attempt)):
                raise StopRequested
        return SendResult(False, reason=reason or CONNECTION, detail=detail, attempts=attempt)

    def _answered(self, resp: _Answer, n_tokens: int, attempt: int) -> SendResult:
        """The sample's result from an answer; reason ABORTED (the server gave up on it) or
        SERVER_ERROR (a 5xx, 408, 429) are worth another try."""
        if resp.status_code == 200:
            return self._check(resp, n_tokens, attempt)
        detail = f"HTTP {resp.status_code}: {resp.text[:200]}"
        if 400 <= resp.status_code < 500 and resp.status_code not in (408, 429):
            return SendResult(False, reason=HTTP_4XX, detail=detail, attempts=attempt)
        return SendResult(False, reason=SERVER_ERROR, detail=detail, attempts=attempt)

    @staticmethod
    def _held_from(rid: str) -> float:
        log.info("%s: the server still holds an earlier send of it; waiting for that one", rid)
        return time.monotonic()

    def _still_running(self, rid: str, waited_s: float) -> bool:
        """No answer yet after `waited_s`: wait on while the server is healthy (it still holds the
        request), up to --server-wait; see the module docstring."""
        if waited_s >= self.policy.server_wait_s:
            log.warning("%s: no answer in %.0f s from a healthy server; sending it again", rid, waited_s)
            return False
        if not self.gate.healthy_now(max_age_s=self.policy.read_timeout_s / 2):
            log.warning(
                "%s: no answer in %.0f s, and the server is not healthy: sending it again once it is", rid, waited_s
            )
            return False
        log.info("%s: no answer in %.0f s; the server is healthy and still holds it: waiting on", rid, waited_s)
        return True

    def _held(self, rid: str, n_tokens: int, attempt: int, held_since: float) -> SendResult | None:
        """The server still holds an earlier send of `rid`: wait a little for it. A result when the
        capture has its word on the earlier send already (the watch then reads it); None to send
        again."""
        waited = time.monotonic() - held_since
        pause = min(HELD_POLL_S[1], HELD_POLL_S[0] * 2 ** int(waited))
        deadline = time.monotonic() + pause
        while True:
            if self.settled(rid):
                return SendResult(
                    True,
                    n_tokens,
                    detail=f"the server held an earlier send of {rid}, which the capture has its word on",
                    attempts=attempt,
                )
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if self.stop.wait(min(left, HELD_POLL_S[0])):
                raise StopRequested

    @staticmethod
    def _check(resp: _Answer, n_tokens: int, attempt: int) -> SendResult:
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
                False,
                prompt_tokens,
                PROMPT_TOKENS_MISMATCH,
                f"server ran {prompt_tokens} prompt tokens, client sent {n_tokens}",
                attempt,
            )
        return SendResult(True, prompt_tokens, attempts=attempt)
