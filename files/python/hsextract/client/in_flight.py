"""The samples in flight: each sent when a slot is free and staging allows it, then held until the
server has answered and the capture has said what became of it.

`InFlight.send` waits for one of ``--max-in-flight`` slots and for the staging limits
(hsextract.client.backpressure), and hands the sample to a sender thread (hsextract.client.sender).
An answered sample stays open until the capture's word (hsextract.client.confirm): staged, it is
done; failed or missing, it is queued to be sent again (`send_again`), up to the attempt limit, and
then reported in the failures file. A server that is gone, or a bug in a sender thread, sets
`fatal` and the run's stop. The runner (hsextract.client.runner) feeds it and reads `fatal` at the
end.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from hsextract.client.backpressure import Backpressure, pause_poll_s
from hsextract.client.config import ExtractConfig
from hsextract.client.confirm import CAPTURE_FAILED, CAPTURE_MISSING, CaptureWatch, Outcome, Verdict
from hsextract.client.progress import RunStats
from hsextract.client.run_jsonl import RunJsonl
from hsextract.client.sender import STOPPED, Sender, SendResult, ServerUnavailable
from hsextract.dataset.chat_template import Encoded
from hsextract.output.layout import FAILURES
from hsextract.staging.dumps import FAILED_FILE, discard_dump, rid_dir
from hsextract.staging.records import remove_record

log = logging.getLogger("hsextract.client")


class InFlight:
    """The run's requests between the producer and their outcome; one per run."""

    def __init__(
        self,
        cfg: ExtractConfig,
        sender: Sender,
        stats: RunStats,
        backpressure: Backpressure,
        failures: RunJsonl,
        stop: threading.Event,
    ):
        self.cfg, self.sender, self.stats, self.stop = cfg, sender, stats, stop
        self.fatal: BaseException | None = None
        self._backpressure = backpressure
        self._failures = failures
        self._slots = threading.Semaphore(cfg.max_in_flight)
        # Answered samples waiting for the capture's word, and those to send again.
        self._open: dict[str, Encoded] = {}
        self._capture_attempts: collections.Counter[str] = collections.Counter()
        self._resend: collections.deque[tuple[str, Encoded]] = collections.deque()
        self._outcomes = threading.Condition()
        # Built here, started when the run begins: a refused start leaves no thread behind.
        self._pool = ThreadPoolExecutor(max_workers=cfg.max_in_flight, thread_name_prefix="hsextract-send")
        self._watch = CaptureWatch(cfg.dump_dir, cfg.capture_timeout_s, self._on_verdict)

    def start(self) -> None:
        self._watch.start()

    def close(self) -> None:
        """Wait for the senders, then stop watching (after a stop, open samples stay open: their
        records stay, and the next run sends them again)."""
        self._pool.shutdown(wait=True)
        self._watch.close()

    # -- the producer's side (the run's thread) ------------------------------------------------------

    def wait_for_answers(self) -> None:
        """Every line read: wait for the last answers and the capture's word on each, sending again
        what the capture failed on."""
        st = self.stats
        while not self.stop.is_set():
            if not self.send_again():
                return
            with self._outcomes:
                if not self._resend and not self._open and st.in_flight == 0:
                    return
                self._outcomes.wait(0.2)

    def send_again(self) -> bool:
        """Send the samples whose capture failed; False if a stop came meanwhile."""
        while True:
            with self._outcomes:
                if not self._resend:
                    return True
                rid, enc = self._resend.popleft()
            if not self.send(rid, enc):
                return False

    def send(self, rid: str, enc: Encoded) -> bool:
        """Wait for a slot and the staging limits, then send; False (nothing sent) on stop."""
        if not self._wait_to_send(len(enc.input_ids)):
            return False
        # A failure marker of an earlier send of this rid would be read as this send's: the client
        # owns failed dumps, and removes one before sending the sample again.
        d = rid_dir(self.cfg.dump_dir, rid)
        if (d / FAILED_FILE).exists():
            discard_dump(d)
        self.stats.sending(len(enc.input_ids))
        fut = self._pool.submit(self.sender.send, rid, enc.input_ids)
        fut.add_done_callback(functools.partial(self._finish, rid, enc))
        return True

    def _wait_to_send(self, n_tokens: int) -> bool:
        """Block until a slot is free and the staging limits allow one more request; False on stop."""
        if not self._wait_for_slot():
            return False
        self._wait_for_staging(n_tokens)
        if self.stop.is_set():
            self._slots.release()
            return False
        return True

    def _wait_for_slot(self) -> bool:
        """Take an in-flight slot; a pause while the server does not answer. False on stop."""
        while not self._slots.acquire(timeout=0.5):
            if self.stop.is_set():
                return False
            down_since = self.sender.gate.down_since
            if down_since is not None:
                since = time.strftime("%H:%M:%S", time.localtime(down_since))
                with self.stats.paused(f"server {self.cfg.server} not answering since {since}; waiting for /health"):
                    while not self._slots.acquire(timeout=0.5):
                        if self.stop.is_set():
                            return False
                return True
        return True

    def _wait_for_staging(self, n_tokens: int) -> None:
        """Wait, as one pause, while the staging limits refuse one more request of `n_tokens`."""
        st = self.stats
        if self.stop.is_set():
            return
        reason = self._backpressure.reason(st.in_flight, st.in_flight_tokens, n_tokens, paused=False)
        if reason is None:
            return
        paused_at = time.monotonic()
        with st.paused(reason) as still:
            while reason is not None and not self.stop.is_set():
                still(reason)
                self.stop.wait(pause_poll_s(time.monotonic() - paused_at))
                if not self.stop.is_set():
                    reason = self._backpressure.reason(st.in_flight, st.in_flight_tokens, n_tokens, paused=True)

    # -- outcomes (called from sender threads and the watch thread) -----------------------------

    def _finish(self, rid: str, enc: Encoded, fut: Future) -> None:
        try:
            res: SendResult = fut.result()
        except ServerUnavailable as exc:
            self.fatal = exc
            self.stop.set()
            res = SendResult(False, reason="server_unavailable", detail=str(exc))
        except BaseException as exc:  # a bug must not hang the run: count it and stop
            self.fatal = exc
            self.stop.set()
            res = SendResult(False, reason="client_error", detail=f"{type(exc).__name__}: {exc}")
        self.stats.answered(len(enc.input_ids))
        if res.ok:
            with self._outcomes:
                self._open[rid] = enc
                self.stats.set_awaiting(len(self._open))
            self._watch.expect(rid)
        elif res.reason == STOPPED:
            pass  # no answer yet and no failure: its record stays, the next run sends it again
        elif self.fatal is None or res.reason not in ("server_unavailable", "client_error"):
            self._failed(rid, enc, res.reason, res.detail, res.attempts)
            if res.reason != "prompt_tokens_mismatch":
                remove_record(self.cfg.dump_dir, rid)  # no dump will come for it
        self._slots.release()
        with self._outcomes:
            self._outcomes.notify_all()

    def _on_verdict(self, rid: str, verdict: Verdict) -> None:
        """The capture's word on an answered sample (from the watch thread)."""
        st = self.stats
        with self._outcomes:
            enc = self._open.pop(rid, None)
            st.set_awaiting(len(self._open))
        if enc is None:
            return
        if verdict.outcome is Outcome.STAGED:
            st.record_ok(len(enc.input_ids))
        else:
            reason = CAPTURE_FAILED if verdict.outcome is Outcome.FAILED else CAPTURE_MISSING
            self._capture_attempts[rid] += 1
            attempts = self._capture_attempts[rid]
            if attempts < self.cfg.retry.max_attempts:
                log.warning(
                    "sample %d (%s): %s (%s); sending it again (attempt %d of %d)",
                    enc.index,
                    rid,
                    reason,
                    verdict.detail,
                    attempts + 1,
                    self.cfg.retry.max_attempts,
                )
                st.record_retried(reason)
                with self._outcomes:
                    self._resend.append((rid, enc))
            else:
                log.error(
                    "sample %d (%s): %s after %d attempts (%s); reported in %s",
                    enc.index,
                    rid,
                    reason,
                    attempts,
                    verdict.detail,
                    FAILURES,
                )
                self._failed(rid, enc, reason, verdict.detail, attempts)
                discard_dump(rid_dir(self.cfg.dump_dir, rid))
                remove_record(self.cfg.dump_dir, rid)
        with self._outcomes:
            self._outcomes.notify_all()

    def _failed(self, rid: str, enc: Encoded, reason: str, detail: str, attempts: int) -> None:
        """A sample this run gives up on: counted, and its line in the failures file."""
        self.stats.record_failed(reason)
        self._failures.write(
            {
                "index": enc.index,
                "line": enc.line,
                "file": enc.file,
                "rid": rid,
                "reason": reason,
                "detail": detail,
                "attempts": attempts,
            }
        )
