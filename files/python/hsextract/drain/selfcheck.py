"""Which samples the drain puts through the self-check, and the check itself.

The fingerprint proves that the staged rows are those the forward pass computed; the self-check
proves that they are the right rows of the right model. Two checks in one pass over the model's
head: the last position's final hidden state gives the token SGLang sampled
(`hsextract.greedy_check`), and, where the drain is given the server's URL, the final states of
the prompt's positions give the server's own logprobs of the prompt (`hsextract.logprob_check`:
a wrong layer or norm placement that keeps the argmax fails it). It reads the whole ``lm_head``
per pass, so it runs on a share of samples: always the first few a drain sees (a wrong layer
or norm placement shows at once), then a stable pseudo-random share chosen by rid (the same
samples on a re-run).

The checks run off the samples' way (hsextract.drain.check_queue): a chosen sample waits, durable
but not committed, for a pass over the head that checks every sample waiting at once. What the
check keeps up with bounds the share: a sample of the share is chosen only while fewer rows wait
than one pass takes; one that comes while more do is written unchecked and counted
(``skipped_for_load``), so the share actually checked is known (``share_checked``). The first few
are chosen whatever the queue holds.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import zlib
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from hsextract.drain.check_queue import PASS_ROWS, CheckQueue, CheckRequest, CheckRows, Verdict
from hsextract.drain.config import DrainConfig
from hsextract.drain.logprob_source import LogprobSource
from hsextract.drain.validate import GREEDY, LOGPROB, InvalidDump
from hsextract.greedy_check import GreedyHead, GreedyVerdict
from hsextract.logprob_check import LogprobVerdict, check_samples
from hsextract.server_logprobs import DEFAULT_MAX_MEAN_ABS_ERROR, DEFAULT_MAX_POSITIONS, ServerLogprobs, bound_for

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
    seen: int = 0  # samples the choice was asked about
    checked: int = 0  # greedy-checked (passed, near ties, and those quarantined as greedy_mismatch)
    near_ties: int = 0
    greedy_failed: int = 0
    no_token: int = 0  # chosen, but the capture saw no greedy token for it (neither check ran)
    skipped_for_load: int = 0  # of the share by rid, but the queue held a pass's worth: written unchecked
    logprob: LogprobCounts = field(default_factory=LogprobCounts)


class GreedySelfCheck:
    """Which samples are checked, their checks (in its queue, hsextract.drain.check_queue) and the
    counts. Thread-safe: the drain's workers ask `chosen` of every sample and `submit` the chosen ones."""

    def __init__(
        self,
        head: GreedyHead,
        share: float = DEFAULT_SHARE,
        first: int = DEFAULT_FIRST,
        *,
        logprobs: LogprobSource | None = None,
        bound: float = DEFAULT_MAX_MEAN_ABS_ERROR,
        publish: Callable[[dict[str, Any]], None] | None = None,
        fail: Callable[[BaseException], None] = lambda exc: None,
        together: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
        pass_rows: int = PASS_ROWS,
    ):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"self-check share {share}: give a number from 0 to 1")
        self.head = head
        self.share = share
        self.first = max(0, int(first))
        self.logprobs = logprobs  # None: the greedy check alone
        self.bound = bound
        # The prompt positions whose final rows a chosen sample brings: the last one, or the logprob check's.
        self.positions = DEFAULT_MAX_POSITIONS if logprobs is not None else 1
        self.counts = SelfCheckCounts()
        self._publish = publish  # the counts go to drain-status.json after each change
        self._lock = threading.Lock()
        self._queue = CheckQueue(self._check, fail=fail, changed=self._report, together=together, pass_rows=pass_rows)
        self._report()

    def chosen(self, rid: str) -> bool:
        """Is the sample of ``rid`` one to check? The first few seen, then a share by rid while the
        queue holds less than a pass's worth (else it is counted as skipped for load). A share of 1
        is every sample, whatever the queue holds: the check then sets the pace."""
        with self._lock:
            self.counts.seen += 1
            if self.counts.seen <= self.first:
                return True
        if not in_share(rid, self.share):
            return False
        if self.share < 1 and self._queue.waiting_rows() + self.positions > self._queue.pass_rows:
            with self._lock:
                self.counts.skipped_for_load += 1
            self._report()
            return False
        return True

    def no_token(self) -> None:
        """A chosen sample whose capture recorded no greedy token: neither check can run (it is written)."""
        with self._lock:
            self.counts.no_token += 1
        self._report()

    def submit(self, rid: str, rows: CheckRows, input_ids: list[int], settle: Callable[[Verdict], None]) -> None:
        """Queue a chosen sample for its check; `settle` gets "passed" or "near_tie" for one that
        passed, InvalidDump (reason ``greedy_mismatch`` or ``logprob_mismatch``, with the numbers)
        for one whose final hidden states are not the server's."""
        self._queue.submit(CheckRequest(rid, rows, input_ids, settle))

    def close(self) -> None:
        """Check every sample submitted (their settling commits or quarantines them), then stop."""
        self._queue.close()
        self.head.close()

    def _check(self, batch: list[CheckRequest]) -> list[Verdict]:
        """One pass over the head for the batch (hsextract.drain.check_queue), each sample with the
        server's logprobs of its prompt where the drain asks the server."""
        servers = self._server_logprobs(batch)
        samples = [(r.rows.sample_rows(), server) for r, (server, _) in zip(batch, servers, strict=True)]
        verdicts = check_samples(self.head, samples, bound=self.bound)
        for (greedy, logprob), (_, not_done) in zip(verdicts, servers, strict=True):
            self._count(greedy, logprob, not_done)
        return [_verdict(greedy, logprob) for greedy, logprob in verdicts]

    def _server_logprobs(self, batch: list[CheckRequest]) -> list[tuple[ServerLogprobs | None, str]]:
        """The server's logprobs of each prompt, asked at once ((None, "") each without a server)."""
        source = self.logprobs
        if source is None:
            return [(None, "")] * len(batch)
        if len(batch) == 1:
            return [source.get(batch[0].input_ids)]
        with ThreadPoolExecutor(min(8, len(batch)), thread_name_prefix="selfcheck-logprobs") as pool:
            return list(pool.map(lambda r: source.get(r.input_ids), batch))

    def _count(self, greedy: GreedyVerdict, logprob: LogprobVerdict | None, not_done: str) -> None:
        with self._lock:
            c = self.counts
            c.checked += 1
            c.near_ties += greedy.near_tie
            c.greedy_failed += not greedy.ok
            if logprob is not None:
                c.logprob.add(logprob, quarantined=greedy.ok and not logprob.ok)
            elif not_done:
                c.logprob.not_done[not_done] += 1

    def summary(self) -> dict[str, Any]:
        """The counts, for drain-status.json (``selfcheck``) and the run's last log lines."""
        queue = self._queue.counts()
        with self._lock:
            c = self.counts
            return {
                "share": self.share,
                "first": self.first,
                "seen": c.seen,
                "checked": c.checked,
                "share_checked": round(c.checked / c.seen, 6) if c.seen else None,
                "near_ties": c.near_ties,
                "greedy_failed": c.greedy_failed,
                "no_token": c.no_token,
                "queue": {**queue, "skipped_for_load": c.skipped_for_load},
                "logprob": c.logprob.as_dict(self.bound) if self.logprobs is not None else None,
            }

    def _report(self) -> None:
        if self._publish is not None:
            self._publish(self.summary())


def in_share(rid: str, share: float) -> bool:
    """Whether ``rid`` falls in the pseudo-random share (by its CRC-32: the same samples on a re-run)."""
    return zlib.crc32(rid.encode()) % 1_000_000 < share * 1_000_000


def _verdict(greedy: GreedyVerdict, logprob: LogprobVerdict | None) -> Verdict:
    if not greedy.ok:
        return InvalidDump(GREEDY, greedy.explain())
    if logprob is not None and not logprob.ok:
        return InvalidDump(LOGPROB, logprob.explain())
    return "near_tie" if greedy.near_tie else "passed"


def log_selfcheck(summary: dict[str, Any]) -> None:
    """The run's last lines about the self-check: what was checked, what failed, what was not done."""
    log.info(
        "greedy self-check: %d samples checked by this process in %d passes over the head (%d near bf16 "
        "ties, %d quarantined as greedy_mismatch); %d chosen had no greedy token recorded",
        summary["checked"],
        summary["queue"]["passes"],
        summary["near_ties"],
        summary["greedy_failed"],
        summary["no_token"],
    )
    skipped = summary["queue"]["skipped_for_load"]
    if skipped:
        log.warning(
            "greedy self-check: %d samples of the %g share written unchecked, the check's queue holding a pass's "
            "worth when they came (%d of %d samples seen were checked)",
            skipped,
            summary["share"],
            summary["checked"],
            summary["seen"],
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
    cfg: DrainConfig,
    *,
    stop: threading.Event | None = None,
    publish: Callable[[dict[str, Any]], None] | None = None,
    fail: Callable[[BaseException], None] = lambda exc: None,
    together: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
) -> GreedySelfCheck | None:
    """The self-check of the configured share, or None (no model, or a share and first of 0);
    with the logprob check where the drain was given the server's URL. Its passes run on
    `DrainConfig.selfcheck_threads` threads; `fail` stops the drain on an error no sample explains;
    the samples one pass settles are committed `together` (hsextract.output.committer)."""
    if not cfg.model_path or (cfg.selfcheck_share <= 0 and cfg.selfcheck_first <= 0):
        if cfg.selfcheck_share > 0 or cfg.selfcheck_first > 0:
            log.warning("greedy self-check off: the drain was given no --model to read the head from")
        return None
    source = LogprobSource(cfg.selfcheck_server, stop=stop) if cfg.selfcheck_server else None
    if source is None:
        log.info("logprob self-check off: the drain was given no --selfcheck-server (the greedy check runs alone)")
    return GreedySelfCheck(
        GreedyHead(cfg.model_path, threads=cfg.selfcheck_threads),
        cfg.selfcheck_share,
        cfg.selfcheck_first,
        logprobs=source,
        bound=bound_for(cfg.precision == "fp8", cfg.selfcheck_logprob_bound),
        publish=publish,
        fail=fail,
        together=together,
    )
