"""How the object store's requests are retried, and the count of every retry, by request and cause.

Two kinds of transient failure are told apart (hsextract.objectstore.store retries both):

* **the server unreachable**: no connection could be made (refused, or not made within the
  connect timeout). The server is down or restarting; it is waited for with backoff, without a
  bound on the attempts, until it answers or the command is stopped: a drain holds (its samples
  stay staged) rather than fail.
* **the server reached, the request failed**: a 5xx or ``SlowDown``, a connection reset or closed
  mid-request, an answer cut short, no answer within the read timeout. Such a request is tried at
  most `DEFAULT_ATTEMPTS` times (``--s3-attempts``), with the same backoff; then the command stops
  with the request and its last error (hsextract.objectstore.store.RequestFailed), a drain's
  samples still staged. A server that keeps
  failing one request is broken in a way waiting does not fix, and a bound makes it loud.

Every retry is counted (`RetryLog`): by request (``PUT``, ``GET``, ``HEAD``, ``LIST``, ``COPY``,
``DELETE``, the multipart steps) and by cause (``500 InternalError``, ``connection closed``...), for
the drain's status (``objectstore.retries`` in drain-status.json, shown by ``hsextract status``)
and the last lines of a drain, a collect and a pull.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

from hsextract.objectstore.store_errors import RequestFailed, Unreachable, code_of, status_of

log = logging.getLogger("hsextract.objectstore")

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 20.0
# Attempts of one request the server answered with a failure (its retries: one fewer). With the
# backoff: 0.5 + 1 + 2 + 4 + 8 + 16 + 20 + 20 + 20 s, about 90 s of failures before a command stops.
DEFAULT_ATTEMPTS = 10

# The names of the requests, by the first word of a store's description of one.
_REQUESTS = {
    "part": "UPLOAD PART",
    "start": "CREATE MULTIPART",
    "complete": "COMPLETE MULTIPART",
    "copy": "COPY",
}


def _boto_errors():
    import botocore.exceptions

    return botocore.exceptions


def _cut_short() -> tuple[type[BaseException], ...]:
    """An answer that ended before its body did. botocore wraps this as ResponseStreamingError while
    a sample streams in, but lets urllib3's own error through where it reads a whole answer itself
    (an error's body, a listing's)."""
    import urllib3.exceptions

    errors = _boto_errors()
    return (errors.ResponseStreamingError, errors.IncompleteReadError, urllib3.exceptions.ProtocolError)


def is_transient(exc: BaseException) -> bool:
    """Whether trying again may fix it: the server unreachable, overloaded or failing for now."""
    errors = _boto_errors()
    if isinstance(
        exc,
        (
            errors.ConnectionError,  # refused, connect timeout, proxy, TLS
            errors.ConnectionClosedError,
            errors.ReadTimeoutError,
            *_cut_short(),  # reset or closed mid-answer
        ),
    ):
        return True
    if isinstance(exc, errors.ClientError):
        status = status_of(exc)
        return status in (429, 500, 502, 503, 504) or code_of(exc) in ("SlowDown", "RequestTimeout", "InternalError")
    return isinstance(exc, (ConnectionError, TimeoutError))


def is_unreachable(exc: BaseException) -> bool:
    """No connection to the server could be made: down, restarting, or not there."""
    errors = _boto_errors()
    return isinstance(exc, (errors.EndpointConnectionError, errors.ConnectTimeoutError, ConnectionRefusedError))


def cause_of(exc: BaseException) -> str:
    """A transient failure in a few words, the same for the same cause (a key of the counts)."""
    errors = _boto_errors()
    if isinstance(exc, errors.ClientError):
        status, code = status_of(exc), code_of(exc)
        return f"{status} {code}" if code and code != str(status) else f"HTTP {status}"
    if is_unreachable(exc):
        return "unreachable"
    if isinstance(exc, errors.ReadTimeoutError):
        return "no answer in time"
    if isinstance(exc, _cut_short()):
        return "answer cut short"
    if isinstance(exc, (errors.ConnectionClosedError, ConnectionResetError)):
        return "connection closed"
    return type(exc).__name__


def request_of(what: str) -> str:
    """``PUT``, ``GET``, ... of a store's description of a request (``PUT <key>``, ``part 2 of <key>``)."""
    first = what.split(" ", 1)[0]
    return _REQUESTS.get(first, first.upper())


def backoff(attempt: int, first_s: float = BACKOFF_FIRST_S) -> float:
    """The wait before attempt ``attempt + 1`` (1-based): `first_s` (``--s3-first-wait``, 0.5 s)
    doubling to 20 s."""
    return min(BACKOFF_MAX_S, first_s * 2 ** max(0, attempt - 1))


class RetryLog:
    """Every retry of one command's requests, and the requests given up (thread-safe; a store and
    its impatient view share one)."""

    def __init__(self, attempts: int = DEFAULT_ATTEMPTS):
        self.attempts = attempts
        self._lock = threading.Lock()
        self.by_request: Counter[str] = Counter()
        self.by_cause: Counter[str] = Counter()
        self.gave_up = 0
        self.last = ""  # the last failure retried, in words

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.by_request.values())

    def note(self, what: str, exc: BaseException) -> None:
        with self._lock:
            self.by_request[request_of(what)] += 1
            self.by_cause[cause_of(exc)] += 1
            self.last = f"{what}: {cause_of(exc)}"

    def note_gave_up(self) -> None:
        with self._lock:
            self.gave_up += 1

    def as_dict(self) -> dict[str, Any]:
        """drain-status.json's ``objectstore.retries``."""
        with self._lock:
            return {
                "total": sum(self.by_request.values()),
                "by_request": _most_first(self.by_request),
                "by_cause": _most_first(self.by_cause),
                "gave_up": self.gave_up,
                "max_attempts": self.attempts,
                "last": self.last,
            }


def _most_first(counts: Counter[str]) -> dict[str, int]:
    """The counts, largest first, then by name (the same order whatever order they came in)."""
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def describe(retries: dict[str, Any]) -> str:
    """One line of text of `RetryLog.as_dict`: how many retries, of what, why, and the bound."""
    total = int(retries.get("total") or 0)
    bound = f"at most {retries.get('max_attempts', DEFAULT_ATTEMPTS)} attempts a request"
    if not total:
        return f"no request retried ({bound}; an unreachable server is waited for)"
    of = ", ".join(f"{k} {v}" for k, v in _most_first(Counter(retries.get("by_request") or {})).items())
    why = ", ".join(f"{k} {v}" for k, v in _most_first(Counter(retries.get("by_cause") or {})).items())
    gave_up = int(retries.get("gave_up") or 0)
    return f"{total} retr{'ies' if total != 1 else 'y'} ({of}; {why}), {bound}" + (
        f"; {gave_up} given up after the last" if gave_up else ""
    )


class Outage:
    """When the server stopped answering (``since``, 0 while it answers), said in the log once as it
    begins and once as it ends, however many requests meet it meanwhile."""

    def __init__(self, name: str):
        self.name = name
        self.since = 0.0
        self._lock = threading.Lock()

    def begin(self, what: str, exc: BaseException) -> None:
        with self._lock:
            if not self.since:
                self.since = time.time()
                log.warning(
                    "object store %s does not answer (%s: %s: %s); waiting and retrying with backoff, "
                    "nothing staged is lost meanwhile",
                    self.name,
                    what,
                    type(exc).__name__,
                    str(exc)[:200],
                )

    def end(self) -> None:
        if self.since:
            with self._lock:
                if self.since:
                    log.warning("object store %s answers again after %.0f s", self.name, time.time() - self.since)
                    self.since = 0.0


def before_retry(
    retries: RetryLog,
    name: str,
    what: str,
    exc: BaseException,
    unreachable: bool,
    failed: int,
    patient: bool,
    delay: float,
) -> None:
    """Count and say a failure of ``what`` that is to be retried; raise where it is not to be: at
    once where the caller is not ``patient`` and the server is unreachable or the attempts are spent
    (`Unreachable`: it comes back later), `RequestFailed` where the server failed the request
    ``retries.attempts`` times."""
    attempts = retries.attempts
    if not patient and (unreachable or failed >= attempts):
        raise Unreachable(f"{name} does not answer ({what}: {cause_of(exc)})") from exc
    if failed >= attempts:
        retries.note_gave_up()
        raise RequestFailed(
            f"{name}: {what}: failed {failed} times, the last: {cause_of(exc)} ({str(exc)[:200]}); the "
            f"server answers but fails this request, and a request is tried at most {attempts} times "
            "(--s3-attempts): stopping here; run it again (a drain's samples stay staged, a pull and a "
            "collect resume)"
        ) from None
    retries.note(what, exc)
    if not unreachable:
        log.warning(
            "object store %s: %s failed (%s), attempt %d of %d; trying again in %.1f s",
            name,
            what,
            cause_of(exc),
            failed,
            attempts,
            delay,
        )
