"""The drain: staged dumps in, durable training-set files out, nothing lost, nothing twice.

Order of operations for one sample (the crash-safety argument)::

    worker     read + validate the dump, encode it, write <output>/.hsextract/tmp/<rid>.tmp, fsync
    checker    (a sample chosen for the self-check) its pass over the model's head: passed, on to
               the committer; failed, the temporary file removed and the dump quarantined
    committer  take the next output index, rename the temporary file to its final name,
               fsync the directory, append the manifest line, fsync the manifest
    committer  delete the staged dump and the client's record

* crash before the rename: a temporary file (removed at start) and the dump is still staged;
* crash after the rename, before the manifest line: a file with an index at or past the
  manifest's length (an orphan: removed at start) and the dump is still staged;
* crash after the manifest line: the dump is staged but its rid is in the manifest, so it is
  removed at start as stale ("already written");
* a torn manifest line (power cut mid-append) is cut off at start; the sample's file is then an
  orphan and its dump was not yet deleted.

So after any crash each sample is either written and recorded once, or still staged, and the
restart finishes the job. Files are renamed and recorded in output-index order by one committer
thread, so the manifest is always the contiguous prefix 0..n-1 (the Arrow row numbering needs it),
while reading, checking, encoding and the big fsyncs run in parallel workers.

The pieces: `recovery` (the start: checks, and the repairs of hsextract.output.repair), `scan`
(a look at each staged directory; `triage` decides what to do with it), `worker` (one dump in,
one durable temporary file out, within the byte budget), `selfcheck` and `check_queue` (the
chosen samples' checks, off the other samples' way), the target (hsextract.output.target: the
output directory or a bucket, never told apart here) and its committer (the commit thread:
hsextract.output.committer, the ordered commit of hsextract.output.commit, which collect uses
too, then the staged dumps' deletion), `header` (the manifest header), `outcomes` (where every
part reports what became of a sample: the stats, the samples in hand (`inflight`), the draft
vocabulary (`vocab`), the quarantine), `clients` (have the clients finished?), `dataset_files` (the
dataset-level files kept up to the manifest); this module is the daemon's life: recover, loop
(scan, prepare in workers, commit), shut down.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hsextract.drain.clients import ClientRuns
from hsextract.drain.config import DrainConfig
from hsextract.drain.dataset_files import DatasetFiles
from hsextract.drain.header import RunHeader
from hsextract.drain.inflight import InFlight
from hsextract.drain.metrics import DrainStats, MetricsServer
from hsextract.drain.outcomes import Outcomes
from hsextract.drain.recovery import recover
from hsextract.drain.scan import Scanner
from hsextract.drain.selfcheck import GreedySelfCheck, log_selfcheck, make_selfcheck
from hsextract.drain.vocab import DrainVocab
from hsextract.drain.warmup import warm_up
from hsextract.drain.worker import SampleWorker, torch_set_threads
from hsextract.drain.worker_processes import WorkerProcesses
from hsextract.durable import check_writable
from hsextract.formats import FORMATS, get_format
from hsextract.formats.base import OutputFormat
from hsextract.objectstore.drain_side import open_target
from hsextract.output.accounts import read_accounts
from hsextract.output.committer import Committer
from hsextract.output.layout import drain_tmp_dir
from hsextract.output.lock import OutputLock
from hsextract.output.target import DirectoryTarget, OutputTarget, TargetUnreachable
from hsextract.process_age import process_age_s
from hsextract.staging.dumps import run_dumps

log = logging.getLogger("hsextract.drain")

# Exit status of `--exit-when-done` when the run's counts do not add up or too many samples failed.
RUN_CHECK_FAILED = 3
# Exit status of a drain that finished its run but could not write the dataset-level files.
FINALIZE_FAILED = 4

__all__ = ["FINALIZE_FAILED", "RUN_CHECK_FAILED", "DrainConfig", "Drainer"]


class Drainer:
    """One drain daemon over one dump directory and one output directory."""

    def __init__(self, cfg: DrainConfig):
        self.cfg = cfg
        self.fmt: OutputFormat = get_format(cfg.format)
        self.out = Path(cfg.output)
        self.stats = DrainStats(format=cfg.format, precision=cfg.precision)
        self.stop_event = threading.Event()
        self.run_id = ""  # the output's, once recovered
        self._inflight = InFlight(max_preparing=cfg.worker_threads * 2)
        self._vocab = DrainVocab(cfg, self.fmt)
        self._outcomes = Outcomes(cfg, self.stats, self._inflight, self._vocab, self.stop_event)
        self._clients = ClientRuns(self.out, cfg.exit_when_done)
        # Built by the recovery, from what the output holds.
        self._header: RunHeader | None = None
        self._selfcheck: GreedySelfCheck | None = None
        self._processes: WorkerProcesses | None = None  # the worker processes, where the workers are processes
        # Where the set lives (hsextract.output.target), opened by the recovery.
        self._target: OutputTarget = DirectoryTarget()
        self._dataset_files = DatasetFiles(cfg, self.fmt, self._vocab, self._outcomes, self.stats, self.stop_event)
        self._metrics: MetricsServer | None = None

    def stop(self) -> None:
        """Finish the samples in hand, then return from run() (safe from a signal handler)."""
        self.stop_event.set()
        self._inflight.wake.set()

    # --- the daemon's life: recover, loop, shut down ---------------------------------------------

    def run(self) -> int:
        """Drain until stopped (or, with exit_when_done, until the client is finished); return an exit code.

        The output's lock (hsextract.output.lock) is held from before the recovery to the end: a
        second drain of this output refuses at start, naming this one."""
        check_writable(self.out, "output directory", "--output")
        with OutputLock(self.out, "drain"):
            return self._run_locked()

    def _run_locked(self) -> int:
        try:
            committer, scanner = self._recover()
            metrics = self._start(committer)
        except BaseException as exc:  # a start check refused it, or a stop while a bucket did not answer
            if self._processes is not None:
                self._processes.close()
            if self._metrics is not None:
                self._metrics.stop()
            if not (isinstance(exc, TargetUnreachable) and self.stop_event.is_set()):
                raise
            log.info("drain stopped before its start was complete (%s); nothing was taken from staging", exc)
            return 0
        pool = ThreadPoolExecutor(max_workers=self.cfg.worker_threads, thread_name_prefix="drain-worker")
        finished_run = False
        try:
            finished_run = self._loop(pool, scanner, committer)
        finally:
            self._shut_down(pool, metrics, committer)
        fatal = self._outcomes.fatal
        if fatal is not None:
            self.stats.set(state="failed")
            self._publish_target_state(last=True)
            self._outcomes.write_status(error=str(fatal))
            raise fatal
        self.stats.set(
            state="done" if not self.stop_event.is_set() else "stopped", in_flight=0, lag=self._our_dumps_left()
        )
        exit_code = check_finished_run(self.out, self.cfg, self._selfcheck, self.stats) if finished_run else 0
        problem = self._dataset_files.problem
        if problem and not self.stop_event.is_set():
            log.error("the dataset-level files lag behind the manifest: %s", problem)
            exit_code = exit_code or FINALIZE_FAILED
        self.stats.set(finalize_problem=problem)
        self._publish_target_state(last=True)
        self._outcomes.write_status()
        log.info(
            "drain stopped: %d samples written by this process, %d in the manifest",
            self.stats.samples,
            self.stats.samples_total,
        )
        return exit_code

    def _recover(self) -> tuple[Committer, Scanner]:
        """Bring the output directory to a consistent state after whatever happened before, and
        build the parts that work on it."""
        cfg, tmp_dir = self.cfg, drain_tmp_dir(self.out)
        # Before the work directory is read: a bucket's makes it equal to the bucket, the truth (no
        # epoch yet: the target is taken over once the start checks passed).
        self._target = open_target(cfg, self.fmt, self.stop_event)
        found = recover(cfg, self.fmt, tmp_dir)
        self.run_id = found.run_id
        self._header = RunHeader(cfg, found.run_id, found.header)
        committer = self._target.committer(
            self.out, self.fmt.relative_path, tmp_dir, cfg.dump_dir, found.entries, self._outcomes
        )
        self._selfcheck = make_selfcheck(
            cfg,
            stop=self.stop_event,
            publish=lambda c: self.stats.set(selfcheck=c),
            fail=self._outcomes.fail,
            together=committer.together,
        )
        if cfg.worker_processes:
            self._start_processes(tmp_dir)
        vocab = self._vocab
        worker = SampleWorker(
            self.fmt,
            self.out,
            tmp_dir,
            cfg.memory_budget_bytes,
            header=self._header,
            commit=committer.put,
            events=self._outcomes,
            selfcheck=self._selfcheck,
            processes=self._processes,
            count_vocab=lambda: vocab.counting,
            durable_tmp=self._target.durable_tmp,
            precision=cfg.precision,
        )
        self._clients.recover()
        self.stats.set(finished_client_runs=sorted(self._clients.consumed))
        self.stats.set(
            run_id=self.run_id,
            samples_total=len(found.entries),
            tokens_total=sum(e.tokens for e in found.entries),
            bytes_total=sum(e.bytes for e in found.entries),
        )
        self._vocab.recover(found.entries, self._target.tokens)
        scanner = Scanner(
            cfg,
            found.run_id,
            inflight=self._inflight,
            committer=committer,
            worker=worker,
            clients=self._clients,
            outcomes=self._outcomes,
            stop=self.stop_event,
        )
        scanner.sweep_records(time.time(), force=True)
        return committer, scanner

    def _start_processes(self, tmp_dir: Path) -> None:
        """The worker processes (hsextract.drain.worker_processes): started in the background, or waited for."""
        cfg = self.cfg
        procs = WorkerProcesses(cfg.worker_processes, cfg.format, tmp_dir, self._import_late, cfg.precision)
        self._processes = procs
        if cfg.wait_for_worker_processes:
            procs.wait_ready()

    def _start(self, committer: Committer) -> MetricsServer | None:
        # The workers are the parallelism; torch's own intra-op threads in each of them only
        # oversubscribe the cores (measured: a finite check runs 10-20x slower under load).
        torch_set_threads(1)
        if FORMATS[self.cfg.format].arrow_dataset and self._processes is None:
            # Its finalize builds an Arrow dataset. Importing `datasets` costs about a second of
            # CPU: with the workers in threads (few cores), pay it once at start, before them, not
            # beside them (measured on 2 cores: an import in a background thread cut the first few
            # GB's drain rate by a fifth). With worker processes, `_import_late` does.
            importlib.import_module("datasets")
        # Warm before "running": the first real sample pays nothing once-only (hsextract.drain.warmup).
        warm_up(self.fmt, drain_tmp_dir(self.out), self.cfg.precision)
        port = self.cfg.metrics_port
        metrics = self._metrics = MetricsServer(self.stats, port) if port is not None else None
        if metrics is not None:
            metrics.start()
            log.info("metrics on http://127.0.0.1:%d/metrics", metrics.port)
        # The last start step: every check that can refuse this drain passed (a bucket's fences the
        # prefix's earlier writers, hsextract.objectstore.output).
        self._target.take_over()
        committer.start()
        self.stats.set(state="running")
        age = process_age_s()
        log.info(
            "draining %s -> %s (%s, %s rows, run %s, %d samples already written, %d workers in %s)%s",
            self.cfg.dump_dir,
            self.out,
            self.cfg.format,
            self.cfg.precision,
            self.run_id,
            len(committer.entries),
            self.cfg.workers,
            "processes" if self._processes is not None else "threads",
            "" if age is None else f", ready {age:.2f} s after the drain's start",
        )
        return metrics

    def _import_late(self) -> None:
        """Once the worker processes are up (their callback): what the format's finalize imports, in a
        thread of its own (`datasets`, a second of CPU for an Arrow format). On a host with the cores
        for worker processes it costs the samples nothing there, while at start it delayed the first
        one by that second."""
        if FORMATS[self.cfg.format].arrow_dataset:
            threading.Thread(target=importlib.import_module, args=("datasets",), name="drain-import-datasets").start()

    def _loop(self, pool: ThreadPoolExecutor, scanner: Scanner, committer: Committer) -> bool:
        """Scan and submit until stopped; True when the run is finished (exit_when_done)."""
        last_status = 0.0
        wake = self._inflight.wake
        while not self.stop_event.is_set() and self._outcomes.fatal is None:
            submitted = scanner.scan_and_submit(pool)
            now = time.monotonic()
            if now - last_status >= self.cfg.status_interval_s:
                self._publish_target_state()
                self._outcomes.write_status()
                last_status = now
            if submitted == 0 and self._inflight.idle():
                if self.cfg.exit_when_done and self._client_finished() and not self._our_dumps_left():
                    log.info("the client has finished and staging holds no dump of this run: finalizing")
                    self.stats.set(finished_client_runs=self._clients.summaries())
                    return True
                if now - self._inflight.last_activity >= self.cfg.finalize_idle_s or self._run_over(committer):
                    self._finalize_if_changed(committer)
            wake.wait(self._wait_s())
            wake.clear()
        return False

    def _publish_target_state(self, last: bool = False) -> None:
        """The target's part of the status; at the end, its last word in the log too."""
        self.stats.set(objectstore=self._target.status())
        said = self._target.last_word() if last else None
        if said:
            log.info("%s", said)

    def _wait_s(self) -> float:
        """How long the main loop waits for a wake: a freed slot, a settled sample or a stop wake
        it, a new dump does not; so with a slot free it looks again soon."""
        if self._inflight.full():
            return self.cfg.poll_interval_s
        return min(self.cfg.poll_interval_s, self.cfg.new_dumps_look_s)

    def _shut_down(self, pool: ThreadPoolExecutor, metrics: MetricsServer | None, committer: Committer) -> None:
        self.stats.set(state="stopping")
        # Finish the samples in hand; never start the queued ones.
        pool.shutdown(wait=True, cancel_futures=True)
        if self._selfcheck is not None:
            self._selfcheck.close()  # the chosen samples in hand: checked, then committed or quarantined
        if self._processes is not None:
            self._processes.close()
        committer.close()
        if self._outcomes.fatal is None:
            try:
                self._finalize_if_changed(committer)
            except Exception as exc:  # the samples are safe; only the dataset-level files lag behind
                log.exception("finalizing at shut-down failed; run `hsextract finalize --output %s`", self.out)
                self._dataset_files.problem = (
                    f"finalizing failed ({type(exc).__name__}: {exc}); run `hsextract finalize --output {self.out}`"
                )
        if metrics:
            metrics.stop()

    def _client_finished(self) -> bool:
        """Whether the run's clients have all finished (hsextract.drain.clients)."""
        return self._clients.finished()

    def _our_dumps_left(self) -> int:
        """This run's sample dumps in staging (probes are not samples)."""
        return sum(not p.probe for _, p in run_dumps(self.cfg.dump_dir, self.run_id))

    def _run_over(self, committer: Committer) -> bool:
        """Samples came since the last finalize, the clients have finished and nothing of the run is
        staged: the run is over, and its dataset-level files are written now rather than after
        --finalize-idle (a daemon drain; hsextract status calls the run done only then)."""
        return (
            len(committer.entries) != self._dataset_files.covered
            and self._client_finished()
            and not self._our_dumps_left()
        )

    def _finalize_if_changed(self, committer: Committer) -> None:
        """Bring the dataset-level files up to the manifest (hsextract.drain.dataset_files)."""
        header = self._header.header if self._header is not None else None
        self._dataset_files.update(self._target, header, committer.entries)


def check_finished_run(out: Path, cfg: DrainConfig, selfcheck: GreedySelfCheck | None, stats: DrainStats) -> int:
    """At the end of a finished run: do the counts add up? 0, or RUN_CHECK_FAILED saying why."""
    accounts = read_accounts(out, cfg.quarantine, final=True)
    if accounts is None:
        log.error("the run cannot be checked: the client's summary in %s lacks the shard's size", out)
        return RUN_CHECK_FAILED
    for line in accounts.lines_of_text():
        log.info("%s", line)
    if selfcheck is not None:
        log_selfcheck(selfcheck.summary())
    stats.set(accounts=accounts.as_dict())
    problems = accounts.problems(cfg.max_failure_share)
    for problem in problems:
        log.error("run check: %s", problem)
    return RUN_CHECK_FAILED if problems else 0
