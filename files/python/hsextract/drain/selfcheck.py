"""Which samples the drain puts through the greedy self-check, and the check itself.

The fingerprint proves that the staged rows are those the forward pass computed; the greedy
self-check proves that they are the right rows of the right model: the last position's final
hidden state, through the model's head, gives the token SGLang sampled (`hsextract.greedy_check`).
It reads the whole ``lm_head`` per sample, so it runs on a share of samples: always the first
few a drain sees (a wrong layer or norm placement shows at once), then a stable pseudo-random
share chosen by rid (the same samples on a re-run).
"""

from __future__ import annotations

import logging
import threading
import zlib
from dataclasses import dataclass

from hsextract.drain.config import DrainConfig
from hsextract.drain.validate import GREEDY, InvalidDump
from hsextract.greedy_check import GreedyHead
from hsextract.staging import DoneMarker, StagedStates

log = logging.getLogger("hsextract.drain")

DEFAULT_SHARE = 0.01
DEFAULT_FIRST = 8


@dataclass
class SelfCheckCounts:
    checked: int = 0
    near_ties: int = 0
    no_token: int = 0  # chosen, but the capture saw no greedy token for it


class GreedySelfCheck:
    """Thread-safe: the drain's workers call `check` for every sample they validate."""

    def __init__(self, head: GreedyHead, share: float = DEFAULT_SHARE, first: int = DEFAULT_FIRST):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"self-check share {share}: give a number from 0 to 1")
        self.head = head
        self.share = share
        self.first = max(0, int(first))
        self.counts = SelfCheckCounts()
        self._seen = 0
        self._lock = threading.Lock()

    def chosen(self, rid: str) -> bool:
        """Is the sample of ``rid`` one to check? (The first few seen, then a share by rid.)"""
        with self._lock:
            self._seen += 1
            if self._seen <= self.first:
                return True
        return zlib.crc32(rid.encode()) % 1_000_000 < self.share * 1_000_000

    def verify(self, marker: DoneMarker, states: StagedStates) -> str:
        """Check a sample `chosen` for the check: "passed" or "near_tie" for one that passed, ""
        for one whose capture recorded no greedy token; InvalidDump (reason ``greedy_mismatch``)
        for one whose final hidden state does not give the server's token."""
        if marker.greedy_token < 0:
            with self._lock:
                self.counts.no_token += 1
            return ""
        verdict = self.head.check(states.hidden[-1, -1], marker.final_hidden, marker.greedy_token)
        with self._lock:
            self.counts.checked += 1
            self.counts.near_ties += verdict.near_tie
        if not verdict.ok:
            raise InvalidDump(GREEDY, verdict.explain())
        return "near_tie" if verdict.near_tie else "passed"


def make_selfcheck(cfg: DrainConfig) -> GreedySelfCheck | None:
    """The greedy self-check of the configured share, or None (no model, or a share and first of 0)."""
    if not cfg.model_path or (cfg.selfcheck_share <= 0 and cfg.selfcheck_first <= 0):
        if cfg.selfcheck_share > 0 or cfg.selfcheck_first > 0:
            log.warning("greedy self-check off: the drain was given no --model to read the head from")
        return None
    return GreedySelfCheck(GreedyHead(cfg.model_path), cfg.selfcheck_share, cfg.selfcheck_first)
