"""How the HTTP runs (`hsextract extract`, `hsextract regenerate`) retry a request and wait for a server.

One policy for both, so that a setting means the same in each: the attempts a sample gets, the
exponential back-off between them, and how long a server that is down is waited for before the
run gives up. Each run passes its own read timeout (a prefill answers in seconds, a reply of
thousands of tokens in minutes).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0  # a long prompt may queue behind many others
    server_wait_s: float = 3600.0  # how long a down server is waited for before the run gives up

    def delay(self, attempt: int) -> float:
        """The back-off before attempt ``attempt + 1``: doubling from `backoff_s`, at most `backoff_max_s`."""
        return min(self.backoff_max_s, self.backoff_s * (2 ** max(0, attempt - 1)))
