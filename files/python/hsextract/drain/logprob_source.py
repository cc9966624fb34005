"""Where the drain's self-check gets the server's own logprobs of a checked sample's prompt.

The drain asks the server itself (`hsextract.server_logprobs`: one request without a rid, which the
capture never stages), for the samples the self-check chose. Why the drain and not the client:
the client would have to know which samples the drain will choose (the first few the drain sees
are not the first few sent), send a heavier request for them (logits at every prompt position),
and hand the answer over beside the record; the drain already has the sample, the head and the
verdict, and a second prefill of 1 % of the prompts costs the server about 1 % more.

A server that does not answer must neither stall the drain nor lose a sample: a request is tried
`ATTEMPTS` times (a refused or reset connection, a 5xx: 1 s, then 4 s apart); an answer of the
wrong shape or a 4xx is not asked again, nor is a request the server did not answer within
its timeout (60 s: a busy server is not sent more). Then the check of that sample is *not done*:
the sample is written on the greedy check alone, the count of checks not done goes up by one with
its reason (drain-status.json, the log), and for `PAUSE_S` seconds after an unanswered ask the
next samples do not wait on the server again (counted the same way). Nothing is dropped and
nothing is silent.
"""

from __future__ import annotations

import logging
import threading
import time

from hsextract.server_logprobs import DEFAULT_TIMEOUT_S, DEFAULT_TOP_K, LogprobsUnavailable, ServerLogprobs, fetch

log = logging.getLogger("hsextract.drain")

ATTEMPTS = 3
RETRY_DELAYS_S = (1.0, 4.0)
PAUSE_S = 60.0

# Why a sample's logprob check was not done (drain-status.json's selfcheck.logprob.not_done_by_reason).
UNREACHABLE = "server_unreachable"  # every attempt failed
TIMED_OUT = "server_timeout"  # no answer within the timeout
PAUSED = "server_unreachable_recently"  # within PAUSE_S of a failed ask: not asked
BAD_ANSWER = "server_answer_unusable"  # an answer of another shape, or a 4xx
STOPPING = "drain_stopping"


class LogprobSource:
    """Thread-safe: the drain's workers ask at once."""

    def __init__(
        self,
        url: str,
        *,
        top_k: int = DEFAULT_TOP_K,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        stop: threading.Event | None = None,
    ):
        self.url = url
        self.top_k = top_k
        self.timeout_s = timeout_s
        self._stop = stop or threading.Event()
        self._lock = threading.Lock()
        self._paused_until = 0.0

    def get(self, input_ids: list[int]) -> tuple[ServerLogprobs | None, str]:
        """The server's logprobs of the prompt, or None and why the check cannot be done."""
        with self._lock:
            if time.monotonic() < self._paused_until:
                return None, PAUSED
        detail = ""
        for attempt in range(ATTEMPTS):
            if attempt and self._stop.wait(RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S)) - 1]):
                return None, STOPPING
            try:
                return fetch(self.url, input_ids, self.top_k, self.timeout_s), ""
            except LogprobsUnavailable as exc:
                detail = str(exc)
                if exc.timed_out:
                    return None, self._pause(TIMED_OUT, detail)
                if not exc.retry:
                    log.warning("logprob self-check not done for a sample: %s", detail)
                    return None, BAD_ANSWER
        return None, self._pause(UNREACHABLE, f"{ATTEMPTS} attempts, the last: {detail}")

    def _pause(self, reason: str, detail: str) -> str:
        """Stop asking for `PAUSE_S` seconds after an unanswered ask; the reason, for the counts."""
        with self._lock:
            self._paused_until = time.monotonic() + PAUSE_S
        log.warning(
            "logprob self-check not done: the server did not answer (%s); the samples of the next %.0f s "
            "are checked on their greedy token alone",
            detail,
            PAUSE_S,
        )
        return reason
