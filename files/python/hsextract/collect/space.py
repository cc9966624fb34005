"""What a full volume does to a collect: it stops with the numbers, or says so and waits.

A full volume (ENOSPC, EDQUOT) is not a sample's failure: with ``--wait-for-space`` the collect
says so with the numbers and retries; without it, it stops with the numbers (exit 5). Either way
every sample committed so far stays, and the next collect goes on from there. The commit itself
does not wait (hsextract.output.commit, policy `stop_short`): it records what fits and returns,
and the runner gives the rest's room back before it stops or waits here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hsextract.durable import free_bytes, is_no_space
from hsextract.errors import HsextractError

log = logging.getLogger("hsextract.collect")
T = TypeVar("T")


class CollectorFull(HsextractError):
    """The collected set's volume is full and the collect was not asked to wait."""

    exit_code = 5  # as `hsextract plan` when the output volume cannot hold the run


@dataclass
class SpacePolicy:
    """Stop (wait_s 0) or wait and retry when the collected set's volume is full."""

    out: Path
    wait_s: float = 0.0

    def handle(self, exc: OSError, left: str) -> None:
        """Raise CollectorFull, or say so and sleep before the caller retries; `left` says what
        is still to do ("12 sample(s), 3456 bytes, still to fetch")."""
        what = (
            f"the collected set's volume is full: {self.out} has {free_bytes(self.out)} bytes free "
            f"({exc.strerror or exc}); {left}"
        )
        if self.wait_s <= 0:
            raise CollectorFull(
                f"{what}. Free space or collect into a larger volume, then run collect again: "
                "every sample collected so far stays, and it goes on from there"
            )
        log.warning("%s; retrying every %g s", what, self.wait_s)
        time.sleep(self.wait_s)

    def retrying(self, fn: Callable[[], T], left: str) -> T:
        """fn(), retried (or stopped) on a full volume."""
        while True:
            try:
                return fn()
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                self.handle(exc, left)
