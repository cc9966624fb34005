"""Which samples the drain puts through the self-check, and the check itself.

The fingerprint proves that the staged rows are those the forward pass computed; the self-check
proves that they are the right rows of the right model. Two checks in one pass over the model's
head: the last position's final hidden state gives the token SGLang sampled
(`hsextract.greedy_check`), and, where the drain is given the server's URL, the final states of
the prompt's positions give the server's own logprobs of the prompt (`hsextract.logprob_check`:
a wrong layer or norm placement that keeps the argmax fails it). It reads the whole ``lm_head``
per sample, so it runs on a share of samples: always the first few a drain sees (a wrong layer
or norm placement shows at once), then a stable pseudo-random share chosen by rid (the same
samples on a re-run).
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hsextract.drain.config import DrainConfig
from hsextract.drain.logprob_source import LogprobSource
from hsextract.drain.validate import GREEDY, LOGPROB, InvalidDump
from hsextract.greedy_check import GreedyHead
from hsextract.logprob_check import LogprobVerdict, check_final_rows
from hsextract.server_logprobs import DEFAULT_MAX_MEAN_ABS_ERROR
from hsextract.staging.dumps import DoneMarker, StagedStates

log = logging.getLogger("hsextract.drain")

DEFAULT_SHARE = 0.01
DEFAULT_FIRST = 8


@dataclass
class LogprobCounts:
    """The logprob check's counts: every greedy-checked sample is either compared or not done."""

    compared: int = 0
    failed: int = 0  # quarantined as logprob_mismatch (its greedy check passed)
    not_done: Counter = field(default_factory=Counter)  # reason -> samples (hsextract.drain.logprob_source)
    worst_mean_abs_error: float = 0.0
    sum_mean_abs_error: float = 0.0
    max_abs_error: float = 0.0

    def add(self, verdict: LogprobVerdict, quarantined: bool) -> None:
        self.compared += 1
        self.failed += quarantined
        self.worst_mean_abs_error = max(self.worst_mean_abs_error, verdict.mean_abs_error)
        self.sum_mean_abs_error += verdict.mean_abs_error
        self.max_abs_error = max(self.max_abs_error, verdict.max_abs_error)

    def as_dict(self, bound: float) -> dict[str, Any]:
        return {
            "compared": self.compared,
            "failed": self.failed,
            "not_done": sum(self.not_done.values()),
            "not_done_by_reason": dict(self.not_done),
            "bound": bound,
            "mean_abs_error_mean": self.sum_mean_abs_error / self.compared if self.compared else None,
            "mean_abs_error_worst": self.worst_mean_abs_error if self.compared else None,
            "max_abs_error": self.max_abs_error if self.compared else None,
        }


@dataclass
class SelfCheckCounts:
    checked: int = 0  # greedy-checked (passed, near ties, and those quarantined as greedy_mismatch)
    near_ties: int = 0
    greedy_failed: int = 0
    no_token: int = 0  # chosen, but the capture saw no greedy token for it (neither check ran)
    logprob: LogprobCounts = field(default_factory=LogprobCounts)


class GreedySelfCheck:
    """Thread-safe: the drain's workers call `verify` for every sample `chosen`."""

    def __init__(
        self,
        head: GreedyHead,
        share: float = DEFAULT_SHARE,
        first: int = DEFAULT_FIRST,
        *,
        logprobs: LogprobSource | None = None,
        bound: float = DEFAULT_MAX_MEAN_ABS_ERROR,
        publish: Callable[[dict[str, Any]], None] | None = None,
    ):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"self-check share {share}: give a number from 0 to 1")
        self.head = head
        self.share = share
        self.first = max(0, int(first))
        self.logprobs = logprobs  # None: the greedy check alone
        self.bound = bound
        self.counts = SelfCheckCounts()
        self._publish = publish  # the counts go to drain-status.json after each check
        self._seen = 0
        self._lock = threading.Lock()
        self._report()

    def chosen(self, rid: str) -> bool:
        """Is the sample of ``rid`` one to check? (The first few seen, then a share by rid.)"""
        with self._lock:
            self._seen += 1
            if self._seen <= self.first:
                return True
        return zlib.crc32(rid.encode()) % 1_000_000 < self.share * 1_000_000

    def verify(self, marker: DoneMarker, states: StagedStates) -> str:
        """Check a sample `chosen` for the check: "passed" or "near_tie" for one that passed, ""
        for one whose capture recorded no greedy token; InvalidDump (reason ``greedy_mismatch`` or
        ``logprob_mismatch``, with the numbers) for one whose final hidden states are not the
        server's."""
        if marker.greedy_token < 0:
            with self._lock:
                self.counts.no_token += 1
            self._report()
            return ""
        server, not_done = self.logprobs.get(states.input_ids.tolist()) if self.logprobs else (None, "")
        greedy, logprob = check_final_rows(
            self.head, states.hidden[:, -1], marker.final_hidden, marker.greedy_token, server, bound=self.bound
        )
        with self._lock:
            c = self.counts
            c.checked += 1
            c.near_ties += greedy.near_tie
            c.greedy_failed += not greedy.ok
            if logprob is not None:
                c.logprob.add(logprob, quarantined=greedy.ok and not logprob.ok)
            elif not_done:
                c.logprob.not_done[not_done] += 1
        self._report()
        if not greedy.ok:
            raise InvalidDump(GREEDY, greedy.explain())
        if logprob is not None and not logprob.ok:
            raise InvalidDump(LOGPROB, logprob.explain())
        return "near_tie" if greedy.near_tie else "passed"

    def summary(self) -> dict[str, Any]:
        """The counts, for drain-status.json (``selfcheck``) and the run's last log lines."""
        with self._lock:
            c = self.counts
            return {
                "share": self.share,
                "first": self.first,
                "checked": c.checked,
                "near_ties": c.near_ties,
                "greedy_failed": c.greedy_failed,
                "no_token": c.no_token,
                "logprob": c.logprob.as_dict(self.bound) if self.logprobs is not None else None,
            }

    def _report(self) -> None:
        if self._publish is not None:
            self._publish(self.summary())


def log_selfcheck(summary: dict[str, Any]) -> None:
    """The run's last lines about the self-check: what was checked, what failed, what was not done."""
    log.info(
        "greedy self-check: %d samples checked by this process (%d near bf16 ties, %d quarantined as "
        "greedy_mismatch); %d chosen had no greedy token recorded",
        summary["checked"],
        summary["near_ties"],
        summary["greedy_failed"],
        summary["no_token"],
    )
    lp = summary["logprob"]
    if lp is None:
        return
    if lp["compared"]:
        log.info(
            "logprob self-check: %d samples compared with the server's logprobs, %d quarantined as "
            "logprob_mismatch (mean abs error: mean %.3g, worst %.3g, bound %.3g; largest single error %.3g)",
            lp["compared"],
            lp["failed"],
            lp["mean_abs_error_mean"],
            lp["mean_abs_error_worst"],
            lp["bound"],
            lp["max_abs_error"],
        )
    if lp["not_done"]:
        log.warning(
            "logprob self-check NOT DONE for %d of %d greedy-checked samples (%s): those were checked on "
            "their greedy token alone",
            lp["not_done"],
            summary["checked"],
            ", ".join(f"{k}: {v}" for k, v in sorted(lp["not_done_by_reason"].items())),
        )


def make_selfcheck(
    cfg: DrainConfig, *, stop: threading.Event | None = None, publish: Callable[[dict[str, Any]], None] | None = None
) -> GreedySelfCheck | None:
    """The self-check of the configured share, or None (no model, or a share and first of 0);
    with the logprob check where the drain was given the server's URL."""
    if not cfg.model_path or (cfg.selfcheck_share <= 0 and cfg.selfcheck_first <= 0):
        if cfg.selfcheck_share > 0 or cfg.selfcheck_first > 0:
            log.warning("greedy self-check off: the drain was given no --model to read the head from")
        return None
    source = LogprobSource(cfg.selfcheck_server, stop=stop) if cfg.selfcheck_server else None
    if source is None:
        log.info("logprob self-check off: the drain was given no --selfcheck-server (the greedy check runs alone)")
    return GreedySelfCheck(
        GreedyHead(cfg.model_path),
        cfg.selfcheck_share,
        cfg.selfcheck_first,
        logprobs=source,
        bound=cfg.selfcheck_logprob_bound,
        publish=publish,
    )
