"""The self-check's queue: the samples chosen for the check wait here, their files durable but not
committed, until a pass over the model's head has checked them.

Why a queue of its own: a check reads the model's whole ``lm_head`` (a gigabyte for an 8B model,
about 0.9 s on the H100 host), while a sample takes the drain milliseconds. When the check ran
inside the sample's preparation, one at a time, the chosen samples waited for one another, and in a
10-second run on the H100 host the last 7-9 of them were committed one a second after the client
had finished: the whole run waited for its self-check. Here a chosen sample leaves its worker (and
its slot of the queue of samples in preparation) as soon as its file is durable, and the checker
takes *every* sample waiting into one pass (`hsextract.greedy_check.GreedyHead.check_many`), which
costs about what a pass for one sample does. So the queue is never more than one pass behind,
whatever the rate of chosen samples; and what the chooser admits is bounded too
(hsextract.drain.selfcheck: a sample of the random share is chosen only while fewer rows wait than
one pass takes), so no pass grows without bound either.

A sample is committed only once its check has passed; one that fails is quarantined with its
reason and never reaches the set (its temporary file is removed). Committing first and taking a
failed sample back out would leave a hole in the manifest's contiguous numbering, which the
Arrow dataset's rows follow, and a window in which a wrong sample is in the set.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from hsextract.drain.validate import InvalidDump

log = logging.getLogger("hsextract.drain")

# The rows one pass takes at most (a chosen sample brings one row, or with the logprob check up to
# 64): measured on 2 cores, a 64 MiB chunk of the head times 1 row takes 6 ms, 64 rows 24 ms, 256 rows
# 84 ms, against a pass of 1.6 s for one row of an 8B-shaped head's 16 chunks: a pass of 256 rows
# costs at most about twice a pass of one.
PASS_ROWS = 256

Verdict = str | InvalidDump  # "passed", "near_tie", or why the sample is quarantined


@dataclass(frozen=True)
class CheckRows:
    """What the self-check reads of a chosen sample, taken by its preparation from the very rows
    it checked and wrote: the final hidden states at the prompt's ``positions`` (ascending, its
    last one last). Plain bytes, not a tensor: it comes back from a worker process by pickle."""

    data: bytes  # [len(positions), hidden_size] in `dtype`
    dtype: str  # torch's name of it, e.g. "bfloat16"
    hidden_size: int
    positions: tuple[int, ...]
    final_hidden: str  # "pre_norm" or "post_norm", as the dump stores them
    token: int  # the server's greedy token
    # Rows of an FP8 set, dequantized as the trainer reads them: the greedy check's wider tie
    # (hsextract.greedy_check.FP8_REL_TIE).
    fp8: bool = False

    def sample_rows(self):  # -> hsextract.logprob_check.SampleRows
        import torch

        from hsextract.greedy_check import BF16_REL_TIE, FP8_REL_TIE
        from hsextract.logprob_check import SampleRows

        rows = torch.frombuffer(bytearray(self.data), dtype=getattr(torch, self.dtype))
        tie = FP8_REL_TIE if self.fp8 else BF16_REL_TIE
        return SampleRows(
            rows.view(len(self.positions), self.hidden_size), list(self.positions), self.final_hidden, self.token, tie
        )


@dataclass
class CheckRequest:
    """A chosen sample waiting for its check; `settle` acts on the verdict (commit or quarantine)."""

    rid: str
    rows: CheckRows
    input_ids: list[int]  # the prompt, for the server's logprobs
    settle: Callable[[Verdict], None]


class CheckQueue:
    """Thread-safe: the drain's workers submit, one checker thread runs the passes (`check`: a batch
    in, a verdict per request out) and settles a pass's requests inside `together` (the committer
    commits them in one step), `close` waits until every request submitted is settled."""

    def __init__(
        self,
        check: Callable[[list[CheckRequest]], list[Verdict]],
        *,
        fail: Callable[[BaseException], None],
        changed: Callable[[], None] = lambda: None,
        together: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
        pass_rows: int = PASS_ROWS,
    ):
        self.pass_rows = max(1, pass_rows)
        self._together = together  # one pass's samples are committed in one step (Committer.together)
        self._check = check
        self._fail = fail  # an error no sample explains (the head cannot be read): the drain stops
        self._changed = changed  # the counts changed (the status file)
        self._waiting: deque[CheckRequest] = deque()
        self._waiting_rows = 0
        self._running = 0
        self._done = 0
        self._passes = 0
        self._closing = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="drain-selfcheck", daemon=True)
        self._thread.start()

    def submit(self, request: CheckRequest) -> None:
        with self._cv:
            self._waiting.append(request)
            self._waiting_rows += len(request.rows.positions)
            self._cv.notify()
        self._changed()

    def waiting_rows(self) -> int:
        """The rows of the samples waiting for a pass (not those of the pass under way)."""
        with self._cv:
            return self._waiting_rows

    def counts(self) -> dict[str, Any]:
        """The queue now: samples waiting, in the pass under way, checked; passes made."""
        with self._cv:
            return {"waiting": len(self._waiting), "running": self._running, "done": self._done, "passes": self._passes}

    def close(self) -> None:
        """Check every sample submitted, then end the checker thread."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join()

    def _take(self) -> list[CheckRequest]:
        """The samples of the next pass: those waiting, oldest first, up to `pass_rows` rows (one at least)."""
        batch: list[CheckRequest] = []
        rows = 0
        while self._waiting:
            n = len(self._waiting[0].rows.positions)
            if batch and rows + n > self.pass_rows:
                break
            batch.append(self._waiting.popleft())
            rows += n
        self._waiting_rows -= rows
        self._running = len(batch)
        return batch

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._closing:
                    self._cv.wait()
                if not self._waiting:
                    return
                batch = self._take()
            self._changed()
            try:
                verdicts = self._check(batch)
                with self._together():
                    for request, verdict in zip(batch, verdicts, strict=True):
                        request.settle(verdict)
            except BaseException as exc:  # the drain stops; the samples stay staged for its next start
                log.exception("the self-check failed")
                self._fail(exc)
                return
            with self._cv:
                self._running = 0
                self._done += len(batch)
                self._passes += 1
            self._changed()
