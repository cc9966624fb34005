"""The drain: staged dumps in, durable training-set files out, nothing lost, nothing twice.

Order of operations for one sample (the crash-safety argument)::

    worker     read + validate the dump, encode it, write <output>/.hsextract/tmp/<rid>.tmp, fsync
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
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hsextract import __version__
from hsextract.drain import validate as v
from hsextract.drain.metrics import DrainStats, MetricsServer, write_status
from hsextract.drain.staged_io import MappedStates, map_states
from hsextract.errors import ConfigError, StagingError
from hsextract.formats import FINAL_HIDDEN_FOR_FORMAT, get_format
from hsextract.formats.base import OutputFormat, Sample, SourceRange
from hsextract.formats.durable import PIECE, free_bytes, fsync_dir, is_no_space, write_payload_durably
from hsextract.formats.manifest import (
    ManifestAppender,
    ManifestEntry,
    ManifestError,
    ManifestHeader,
    default_checksum_algorithm,
    iter_entries,
    new_hasher,
    read_header,
    repair_torn_tail,
    state_dir,
    write_header,
)
from hsextract.records import SampleRecord, load_or_create_run_id, parse_rid, read_record, record_path, remove_record
from hsextract.staging import DONE_FILE, STATES_FILE, DoneMarker, iter_dump_dirs, read_done_marker
from hsextract.vocab.counts import masked_counts
from hsextract.vocab.mapping import VocabError
from hsextract.vocab.tracker import VocabTracker

log = logging.getLogger("hsextract.drain")

CLIENT_SUMMARY = "client-summary.json"
CLIENT_FAILURES = "failures.jsonl"  # the samples the client gave up on, one JSON object with "rid" per line
TMP_DIR = "tmp"
# One worker per core up to 8: measured on 2 and 16 cores, more threads than cores only contend.
DEFAULT_WORKERS = max(1, min(8, os.cpu_count() or 1))
SOURCE_FILE = "source.json"  # in a quarantined dump: which staged dump it is a copy of
TRASH_PREFIX = ".trash-"  # dump directories being deleted (dot names are never scanned as dumps)


@dataclass
class DrainConfig:
    dump_dir: Path
    output: Path
    format: str
    # What every dump must look like; None = take it from the manifest header or the first dump.
    expected_dtype: str | None = None
    expected_hidden_size: int | None = None
    eagle_layer_ids: tuple[int, ...] | None = None
    sglang_layer_ids: tuple[int, ...] | None = None
    num_hidden_layers: int | None = None
    model_path: str = ""
    model_config_sha256: str = ""
    architecture: str = ""
    quarantine_dir: Path | None = None
    workers: int = DEFAULT_WORKERS
    memory_budget_bytes: int = 2 << 30
    poll_interval_s: float = 0.5
    record_grace_s: float = 300.0  # a complete dump with no client record is removed after this
    incomplete_timeout_s: float = 1800.0  # a dump without done marker is quarantined after this
    # ...or after this, once the client has finished and listed the sample in its failures.jsonl
    # (it gave up on it: no done marker will come, and --exit-when-done should not wait 30 min).
    abandoned_grace_s: float = 60.0
    enospc_retry_s: float = 5.0
    status_interval_s: float = 2.0
    finalize_idle_s: float = 60.0  # rebuild dataset-level files after this long with nothing to do
    metrics_port: int | None = None
    exit_when_done: bool = False
    # Draft vocabulary (hsextract.vocab): loss-masked token counts kept with the manifest, and the
    # trainers' mapping files written at finalize for each size. vocab_size None = the header's.
    count_vocab: bool = True
    draft_vocab_sizes: tuple[int, ...] = (32000,)
    vocab_size: int | None = None
    vocab_checkpoint_interval_s: float = 30.0

    @property
    def quarantine(self) -> Path:
        return self.quarantine_dir or (self.output / "quarantine")


@dataclass
class _Prepared:
    """A sample whose temporary file is durable, waiting for its output index."""

    rid: str
    dataset_index: int
    tokens: int
    tmp: Path
    nbytes: int
    checksum: str
    dump: Path
    vocab: tuple | None = None  # (token ids, counts) of the sample's loss-masked tokens


class _ByteBudget:
    """Bounds the bytes of samples held in memory at once (one oversized sample may go alone)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._cv = threading.Condition()

    def acquire(self, n: int) -> None:
        with self._cv:
            while self.used and self.used + n > self.limit:
                self._cv.wait()
            self.used += n

    def release(self, n: int) -> None:
        with self._cv:
            self.used -= n
            self._cv.notify_all()


class Drainer:
    """One drain daemon over one dump directory and one output directory."""

    def __init__(self, cfg: DrainConfig):
        self.cfg = cfg
        self.fmt: OutputFormat = get_format(cfg.format)
        # The format's file body is the staged bytes, checked as they are sent (see SourceRange).
        self._streams_staged = bool(getattr(self.fmt, "streams_staged", False))
        self.out = Path(cfg.output)
        self.dump_dir = Path(cfg.dump_dir)
        self.tmp_dir = state_dir(self.out) / TMP_DIR
        self.stats = DrainStats(format=cfg.format)
        self.stop_event = threading.Event()
        # Set when a worker frees a queue slot (or on stop): the scan runs again at once instead
        # of after the poll interval, so the workers never wait for the next scheduled look.
        self._wake = threading.Event()
        self._budget = _ByteBudget(cfg.memory_budget_bytes)
        self._commit_q: queue.Queue[_Prepared | None] = queue.Queue()
        self._inflight: set[str] = set()  # submitted and not yet committed (or given up)
        self._preparing = 0  # of those, how many the workers have not finished: the queue's bound
        self._inflight_lock = threading.Lock()
        self._done_rids: set[str] = set()
        self._done_indices: set[int] = set()
        self._entries: list[ManifestEntry] = []
        self._header: ManifestHeader | None = None
        self._header_lock = threading.Lock()
        self._appender: ManifestAppender | None = None
        self._fatal: BaseException | None = None
        self._pause_lock = threading.Lock()
        self._last_activity = time.monotonic()
        self._finalized_at_count = -1
        self._last_record_sweep = 0.0
        self._last_full_scan = 0.0
        self._abandoned: set[str] = set()
        self._abandoned_key: tuple[int, int] | None = None
        self._vocab: VocabTracker | None = None
        self.run_id = ""

    # --- start-up -------------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the samples in hand, then return from run() (safe from a signal handler)."""
        self.stop_event.set()
        self._wake.set()

    def recover(self) -> None:
        """Bring the output directory to a consistent state after whatever happened before."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.run_id = load_or_create_run_id(self.out)
        self.stats.set(run_id=self.run_id)
        torn = repair_torn_tail(self.out)
        if torn:
            log.warning("manifest: cut off a torn last line (%d bytes) left by a crash", torn)
        self._entries = list(iter_entries(self.out))
        for n, e in enumerate(self._entries):
            if e.output_index != n:
                raise ManifestError(
                    f"{self.out}/manifest.jsonl: entry {n} has output index {e.output_index}; "
                    "the manifest must number samples 0, 1, 2... (was it edited?)"
                )
        self._done_rids = {e.rid for e in self._entries}
        self._done_indices = {e.dataset_index for e in self._entries}
        self.stats.set(samples_total=len(self._entries))
        self._header = read_header(self.out)
        if self._header is not None:
            self._check_header_matches_config(self._header)
        elif self._entries:
            raise ManifestError(f"{self.out}: manifest.jsonl has entries but manifest.json is missing; restore it")
        if self.cfg.count_vocab:
            self._vocab = VocabTracker(self.out, self.fmt, self.cfg.draft_vocab_sizes,
                                       self.cfg.vocab_checkpoint_interval_s)
            try:
                self._vocab.recover(self._entries)
            except VocabError as exc:  # the training set comes first: drain on, counting nothing this time
                log.error("draft vocabulary not counted by this process: %s", exc)
                self._vocab = None
        for leftover in self.dump_dir.glob(f"{TRASH_PREFIX}*"):
            shutil.rmtree(leftover, ignore_errors=True)
        self._sweep_records(time.time(), force=True)
        if self.tmp_dir.exists():
            shutil.rmtree(self.tmp_dir)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        removed = self._remove_orphans()
        if removed:
            log.warning("removed %d file(s) written but never recorded (crash before the manifest line): %s",
                        len(removed), ", ".join(removed[:5]))

    def _remove_orphans(self) -> list[str]:
        """Files at output indices the manifest has not reached (renamed in order, so contiguous)."""
        removed = []
        i = len(self._entries)
        while True:
            p = self.out / self.fmt.relative_path(i)
            if not p.exists():
                break
            p.unlink()
            fsync_dir(p.parent)
            removed.append(str(p.relative_to(self.out)))
            i += 1
        return removed

    def _check_header_matches_config(self, h: ManifestHeader) -> None:
        c = self.cfg
        problems = []
        if h.format != c.format:
            problems.append(f"format {h.format!r} (configured {c.format!r})")
        if c.expected_dtype and h.dtype != c.expected_dtype:
            problems.append(f"dtype {h.dtype} (configured {c.expected_dtype})")
        if c.expected_hidden_size and h.hidden_size != c.expected_hidden_size:
            problems.append(f"hidden size {h.hidden_size} (configured {c.expected_hidden_size})")
        if c.eagle_layer_ids and tuple(h.eagle_aux_hidden_state_layer_ids) != tuple(c.eagle_layer_ids):
            problems.append(
                f"eagle layer ids {h.eagle_aux_hidden_state_layer_ids} (configured {list(c.eagle_layer_ids)})"
            )
        if problems:
            raise ConfigError(
                f"output directory {self.out} was written with " + "; ".join(problems)
                + ". Use the same configuration to resume, or a new output directory."
            )

    def expected(self) -> v.Expected:
        h, c = self._header, self.cfg
        return v.Expected(
            final_hidden=FINAL_HIDDEN_FOR_FORMAT[c.format],
            dtype=h.dtype if h else c.expected_dtype,
            hidden_size=h.hidden_size if h else c.expected_hidden_size,
            eagle_aux_hidden_state_layer_ids=tuple(h.eagle_aux_hidden_state_layer_ids) if h else c.eagle_layer_ids,
        )

    def _ensure_header(self, marker: DoneMarker) -> None:
        """Write the manifest header from the configuration and the first valid dump."""
        with self._header_lock:
            if self._header is not None:
                return
            c = self.cfg
            eagle = list(c.eagle_layer_ids or marker.eagle_aux_hidden_state_layer_ids)
            header = ManifestHeader(
                format=c.format,
                final_hidden=marker.final_hidden,
                dtype=c.expected_dtype or marker.dtype,
                hidden_size=c.expected_hidden_size or marker.hidden_size,
                num_aux=len(eagle),
                eagle_aux_hidden_state_layer_ids=eagle,
                sglang_layers_to_capture=list(c.sglang_layer_ids or marker.sglang_layers_to_capture),
                num_hidden_layers=c.num_hidden_layers or marker.num_hidden_layers,
                model_path=c.model_path or marker.model_path,
                model_config_sha256=c.model_config_sha256,
                architecture=c.architecture or marker.architecture,
                vocab_size=c.vocab_size or 0,
                sglang_version=marker.sglang_version,
                hsextract_version=__version__,
                run_id=self.run_id,
                checksum_algorithm=default_checksum_algorithm(),
                created_at=time.time(),
            )
            write_header(self.out, header)
            self._header = header

    # --- the main loop --------------------------------------------------------------------

    def run(self) -> int:
        """Drain until stopped (or, with exit_when_done, until the client is finished); return an exit code."""
        self.recover()
        # The workers are the parallelism; torch's own intra-op threads in each of them only
        # oversubscribe the cores (measured: a finite check runs 10-20x slower under load).
        torch_set_threads(1)
        if self.cfg.format == "speculators":
            # Its finalize builds an Arrow dataset. Importing `datasets` costs about a second of
            # CPU: pay it once at start, before the workers, not beside them (measured on 2 cores:
            # an import in a background thread cut the first few GB's drain rate by a fifth).
            importlib.import_module("datasets")
        self._appender = ManifestAppender(self.out)
        metrics = None
        if self.cfg.metrics_port is not None:
            metrics = MetricsServer(self.stats, self.cfg.metrics_port)
            metrics.start()
            log.info("metrics on http://127.0.0.1:%d/metrics", metrics.port)
        committer = threading.Thread(target=self._commit_loop, name="drain-commit", daemon=True)
        committer.start()
        pool = ThreadPoolExecutor(max_workers=max(1, self.cfg.workers), thread_name_prefix="drain-worker")
        self.stats.set(state="running")
        log.info(
            "draining %s -> %s (%s, run %s, %d samples already written, %d workers)",
            self.dump_dir, self.out, self.cfg.format, self.run_id, len(self._entries), self.cfg.workers,
        )
        last_status = 0.0
        exit_code = 0
        try:
            while not self.stop_event.is_set() and self._fatal is None:
                submitted = self._scan_and_submit(pool)
                now = time.monotonic()
                if now - last_status >= self.cfg.status_interval_s:
                    self._write_status()
                    last_status = now
                if submitted == 0 and self._idle():
                    if self.cfg.exit_when_done and self._client_finished() and not self._our_dumps_left():
                        log.info("the client has finished and staging holds no dump of this run: finalizing")
                        break
                    if now - self._last_activity >= self.cfg.finalize_idle_s:
                        self._finalize_if_changed()
                self._wake.wait(self.cfg.poll_interval_s)
                self._wake.clear()
        finally:
            self.stats.set(state="stopping")
            # Finish the samples in hand; never start the queued ones.
            pool.shutdown(wait=True, cancel_futures=True)
            self._commit_q.put(None)
            committer.join()
            if self._fatal is None:
                with contextlib.suppress(Exception):
                    self._finalize_if_changed()
            self._appender.close()
            if metrics:
                metrics.stop()
        if self._fatal is not None:
            self.stats.set(state="failed")
            self._write_status(error=str(self._fatal))
            raise self._fatal
        self.stats.set(state="done" if not self.stop_event.is_set() else "stopped")
        self._write_status()
        log.info("drain stopped: %d samples written by this process, %d in the manifest",
                 self.stats.samples, self.stats.samples_total)
        return exit_code

    def _idle(self) -> bool:
        with self._inflight_lock:
            return not self._inflight

    def _write_status(self, **extra: object) -> None:
        try:
            write_status(self.out, self.stats, pid=os.getpid(), dump_dir=str(self.dump_dir), **extra)
        except OSError as exc:
            log.warning("cannot write the status file (%s)", exc)

    def _client_finished(self) -> bool:
        return (state_dir(self.out) / CLIENT_SUMMARY).exists()

    def _abandoned_rids(self) -> set[str]:
        """Rids the client gave up on (its failures.jsonl), once the client has finished; else empty."""
        if not self._client_finished():
            return set()
        path = state_dir(self.out) / CLIENT_FAILURES
        try:
            st = path.stat()
        except FileNotFoundError:
            return set()
        key = (st.st_size, st.st_mtime_ns)
        if key != self._abandoned_key:
            rids = set()
            with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    with contextlib.suppress(ValueError, TypeError, AttributeError):
                        rid = json.loads(line).get("rid")
                        if isinstance(rid, str):
                            rids.add(rid)
            self._abandoned, self._abandoned_key = rids, key
        return self._abandoned

    def _our_dumps_left(self) -> bool:
        for d in iter_dump_dirs(self.dump_dir):
            p = parse_rid(d.name)
            if p is not None and p.run_id == self.run_id:
                return True
        return False

    def _finalize_if_changed(self) -> None:
        n = len(self._entries)
        if n == self._finalized_at_count or self._header is None:
            return
        paths = self.fmt.finalize(self.out, self._header, list(self._entries))
        if self._vocab is not None:
            try:
                vocab_files = self._vocab.write_files(self.cfg.vocab_size or self._header.vocab_size)
                log.info("draft vocabulary of %d samples: %d files written (see draft_vocab.json)", n,
                         len(vocab_files))
            except VocabError as exc:  # the counts stay checkpointed; only the mapping files are missing
                log.error("draft vocabulary files not written: %s", exc)
        self._finalized_at_count = n
        if paths:
            log.info("dataset-level files rebuilt for %d samples: %s", n, ", ".join(p.name for p in paths))

    # --- scanning -------------------------------------------------------------------------

    def _scan_and_submit(self, pool: ThreadPoolExecutor) -> int:
        """Look at the staged dumps: submit complete ones, remove stale ones; return how many were submitted.

        A full scan (every dump looked at, the lag counted) runs at most once per poll interval.
        A scan woken early by a worker that freed a slot stops as soon as the queue is full
        again: with thousands of dumps staged, looking at each of them after every sample would
        take the cores the workers need (measured: a third of a core on 2 cores).
        """
        submitted = 0
        lag = 0
        now = time.time()
        full = time.monotonic() - self._last_full_scan >= self.cfg.poll_interval_s
        if full:
            self._last_full_scan = time.monotonic()
        max_queued = max(1, self.cfg.workers) * 2
        for d in iter_dump_dirs(self.dump_dir):
            if self.stop_event.is_set():
                break
            rid = d.name
            with self._inflight_lock:
                if rid in self._inflight:
                    lag += 1
                    continue
            parsed = parse_rid(rid)
            complete = (d / DONE_FILE).exists()
            if parsed is None:
                self._remove_stale(d, rid, "not a client request id")
                continue
            if parsed.run_id != self.run_id:
                if complete or _age(d, now) > self.cfg.incomplete_timeout_s:
                    self._remove_stale(d, rid, "from another run")
                continue
            if rid in self._done_rids or parsed.index in self._done_indices:
                # Written and recorded: whatever is left of its dump is garbage (even an
                # incomplete one; the client never resends a sample the manifest has).
                self._remove_stale(d, rid, "already written")
                continue
            if not complete:
                age = _age(d, now)
                if age > self.cfg.incomplete_timeout_s:
                    self._quarantine(
                        d, rid, v.INCOMPLETE,
                        f"no {DONE_FILE} {age:.0f} s after the dump was last written "
                        f"(limit {self.cfg.incomplete_timeout_s:.0f} s): the request never finished",
                    )
                elif age > self.cfg.abandoned_grace_s and rid in self._abandoned_rids():
                    self._quarantine(
                        d, rid, v.INCOMPLETE,
                        f"no {DONE_FILE} {age:.0f} s after the dump was last written, and the client, now "
                        f"finished, gave up on this sample (see {CLIENT_FAILURES})",
                    )
                continue
            lag += 1
            with self._inflight_lock:
                queue_full = self._preparing >= max_queued
            if queue_full:
                if not full:
                    break
                continue  # the workers have enough; only count the rest
            try:
                record = read_record(self.dump_dir, rid)
            except StagingError as exc:
                self._quarantine(d, rid, v.RECORD, str(exc))
                continue
            if record is None:
                if _age(d / DONE_FILE, now) > self.cfg.record_grace_s:
                    self._remove_stale(d, rid, "no client record")
                continue
            if record.index != parsed.index:
                self._quarantine(d, rid, v.RECORD, f"record says dataset index {record.index}, rid says {parsed.index}")
                continue
            with self._inflight_lock:
                if self._preparing >= max_queued:
                    continue
                self._inflight.add(rid)
                self._preparing += 1
            fut = pool.submit(self._process, d, record)
            fut.add_done_callback(self._task_done)
            submitted += 1
        with self._inflight_lock:
            self.stats.set(in_flight=len(self._inflight))
            if full:
                self.stats.set(lag=lag)
        if submitted:
            self._last_activity = time.monotonic()
        self._sweep_records(now)
        return submitted

    def _task_done(self, fut: Future) -> None:
        exc = fut.exception() if not fut.cancelled() else None
        if exc is not None and self._fatal is None:
            log.error("drain worker failed: %r", exc)
            self._fatal = exc
            self.stop_event.set()

    def _sweep_records(self, now: float, force: bool = False) -> None:
        """Remove records nobody will use: written samples' at once, other runs' after the grace period."""
        if not force and now - self._last_record_sweep < 30:
            return
        self._last_record_sweep = now
        rdir = self.dump_dir / "_records"
        try:
            names = os.listdir(rdir)
        except FileNotFoundError:
            return
        for name in names:
            if not name.endswith(".json") or name.startswith("."):
                continue
            rid = name[: -len(".json")]
            p = parse_rid(rid)
            if p is None:
                continue
            if (self.dump_dir / rid).exists():
                continue  # the scan decides about its dump first
            written = p.run_id == self.run_id and (rid in self._done_rids or p.index in self._done_indices)
            foreign = p.run_id != self.run_id and _age(rdir / name, now) > self.cfg.record_grace_s
            if written or foreign:
                with contextlib.suppress(FileNotFoundError):
                    (rdir / name).unlink()

    def _discard(self, d: Path) -> None:
        """Remove a dump directory so that a crash midway cannot leave a half-deleted dump behind.

        The rename to a dot name is atomic and takes the dump out of every scan at once; the
        dot directory is deleted next, or at the next start if the drain dies first.
        """
        trash = d.parent / f"{TRASH_PREFIX}{d.name}-{time.time_ns()}"
        try:
            os.rename(d, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def _remove_stale(self, d: Path, rid: str, why: str) -> None:
        if not d.exists():
            return  # removed meanwhile (committed by another thread)
        log.warning("stale dump %s removed: %s", rid, why)
        self._discard(d)
        if why != "no client record":
            remove_record(self.dump_dir, rid)
        self.stats.add_stale(why)

    def _quarantine(self, d: Path, rid: str, reason: str, detail: str) -> None:
        """Move a dump (and its record) out of staging with a reason file; never into the training set.

        The copy is made under a temporary name, renamed into place, and only then is the staged
        dump removed. A crash between the rename and the removal leaves the same dump in both
        places: the copy records which staged dump it came from (`SOURCE_FILE`), so the restart
        only finishes the removal instead of quarantining it a second time. A later dump of the
        same rid (the client resent the sample) is another dump and gets its own directory.
        """
        qroot = self.cfg.quarantine
        source = _dump_identity(d)
        target = qroot / rid
        n = 1
        while target.exists():
            if _read_source(target) == source:
                log.warning("dump %s was quarantined to %s before a restart; removing the staged copy", rid, target)
                self._discard(d)
                remove_record(self.dump_dir, rid)
                return
            target = qroot / f"{rid}.{n}"
            n += 1
        while True:
            try:
                qroot.mkdir(parents=True, exist_ok=True)
                tmp = qroot / f".{target.name}.tmp"
                if tmp.exists():
                    shutil.rmtree(tmp)
                shutil.copytree(d, tmp)
                rec = record_path(self.dump_dir, rid)
                if rec.exists():
                    shutil.copy2(rec, tmp / "record.json")
                (tmp / "reason.txt").write_text(f"{reason}\n{detail}\n")
                (tmp / SOURCE_FILE).write_text(json.dumps(source) + "\n")
                os.replace(tmp, target)
                break
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                self._pause_for_space(qroot, exc)
        self._discard(d)
        remove_record(self.dump_dir, rid)
        self.stats.add_quarantined(reason)
        log.error("dump %s quarantined to %s: %s: %s", rid, target, reason, detail)

    # --- workers --------------------------------------------------------------------------

    def _process(self, d: Path, record: SampleRecord) -> None:
        try:
            self._process_bounded(d, record)
        finally:
            # Prepared samples wait for the committer without holding a queue slot: its
            # directory fsyncs must not leave the workers idle.
            with self._inflight_lock:
                self._preparing -= 1
            self._wake.set()

    def _process_bounded(self, d: Path, record: SampleRecord) -> None:
        rid = record.rid
        try:
            if self._streams_staged:
                size = PIECE  # sent from the mapping piece by piece, whatever the sample's size
            else:
                # Mapping the staged file costs no memory (the pages are tmpfs's own), but the
                # format's reordered copy of the rows does: about the sample's size.
                try:
                    size = (d / STATES_FILE).stat().st_size
                except FileNotFoundError:
                    size = 0
            self._budget.acquire(size)
            try:
                self._process_in_budget(d, record)
            finally:
                self._budget.release(size)
        except BaseException:
            with self._inflight_lock:
                self._inflight.discard(rid)
            raise

    def _process_in_budget(self, d: Path, record: SampleRecord) -> None:
        rid = record.rid
        mapped = None
        failure: tuple[str, str] | None = None
        try:
            marker = read_done_marker(d)
            mapped = map_states(d / STATES_FILE)
            v.validate(marker, mapped.states, record, self.expected(), check_values=not self._streams_staged)
            prepared = self._write_temporary(d, record, marker, mapped)
        except StagingError as exc:
            failure = (v.UNREADABLE, str(exc))
        except v.InvalidDump as exc:  # from the checks, or met while streaming the rows
            failure = (exc.reason, exc.detail)
        finally:
            if mapped is not None:
                mapped.close()
        if failure is not None:
            self._quarantine(d, rid, *failure)
            self._forget(rid)
            return
        self._commit_q.put(prepared)

    def _write_temporary(self, d: Path, record: SampleRecord, marker: DoneMarker, mapped: MappedStates) -> _Prepared:
        """Encode a validated dump into its durable temporary file; the committer gives it its name."""
        self._ensure_header(marker)
        assert self._header is not None
        states = mapped.states
        sample = Sample(
            rid=record.rid,
            dataset_index=record.index,
            input_ids=states.input_ids,
            loss_mask=_as_int64(record.loss_mask),
            hidden=states.hidden,
            staged=SourceRange(mapped.fd, mapped.data_start, mapped.data_len, mapped.view),
        )
        if self._streams_staged:
            h = states.hidden
            sample.staged.check = v.finite_checker(h.dtype, h.shape[1] * h.shape[2] * h.element_size())
            sample.staged.check_len = mapped.hidden_len
        payload = self.fmt.encode(sample)
        tmp = self.tmp_dir / f"{record.rid}.tmp"
        while True:
            hasher = new_hasher(self._header.checksum_algorithm)
            try:
                nbytes = write_payload_durably(tmp, payload, hasher)
                break
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                self._pause_for_space(self.out, exc)
        checksum = f"{self._header.checksum_algorithm}:{hasher.hexdigest()}"
        vocab = masked_counts(sample.input_ids, sample.loss_mask) if self._vocab is not None else None
        return _Prepared(record.rid, record.index, len(record.input_ids), tmp, nbytes, checksum, d, vocab)

    def _forget(self, rid: str) -> None:
        with self._inflight_lock:
            self._inflight.discard(rid)
        self._wake.set()  # the main loop may be waiting for the last sample to leave

    def _pause_for_space(self, path: Path, exc: OSError) -> None:
        free = free_bytes(path)
        reason = (
            f"output volume full: {path} has {free} bytes free ({exc.strerror}); "
            f"retrying every {self.cfg.enospc_retry_s:g} s"
        )
        with self._pause_lock:
            if self.stats.paused_reason != reason:
                log.error("%s", reason)
            self.stats.set(paused_reason=reason, state="paused")
        self._write_status()
        time.sleep(self.cfg.enospc_retry_s)
        with self._pause_lock:
            self.stats.set(paused_reason="", state="running")

    # --- committing -----------------------------------------------------------------------

    def _commit_loop(self) -> None:
        try:
            while True:
                first = self._commit_q.get()
                if first is None:
                    return
                batch = [first]
                stop_after = False
                while True:
                    try:
                        nxt = self._commit_q.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop_after = True
                        break
                    batch.append(nxt)
                self._commit(batch)
                if stop_after:
                    return
        except BaseException as exc:
            log.exception("drain committer failed")
            self._fatal = exc
            self.stop_event.set()

    def _commit(self, batch: list[_Prepared]) -> None:
        assert self._appender is not None
        entries: list[ManifestEntry] = []
        done: list[_Prepared] = []
        dirs: set[Path] = set()
        now = time.time()
        for p in batch:
            if p.rid in self._done_rids or p.dataset_index in self._done_indices:
                # A second dump of a written sample (the client resent it): drop it, keep the first.
                p.tmp.unlink(missing_ok=True)
                self._remove_stale(p.dump, p.rid, "already written")
                self._forget(p.rid)
                continue
            idx = len(self._entries) + len(entries)
            rel = self.fmt.relative_path(idx)
            final = self.out / rel
            if not final.parent.exists():
                final.parent.mkdir(parents=True)
                fsync_dir(final.parent.parent)
            os.replace(p.tmp, final)
            dirs.add(final.parent)
            entries.append(ManifestEntry(idx, p.dataset_index, p.rid, p.tokens, rel, p.nbytes, p.checksum, now))
            done.append(p)
        if not entries:
            return
        for d in dirs:
            fsync_dir(d)
        fsync_dir(self.tmp_dir)
        while True:
            try:
                self._appender.append(entries)
                break
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                self._pause_for_space(self.out, exc)
        self._entries.extend(entries)
        if self._vocab is not None:
            self._vocab.add(entries, [p.vocab for p in done], covered=len(self._entries))
        for e in entries:
            self._done_rids.add(e.rid)
            self._done_indices.add(e.dataset_index)
        # Only now is the sample safe on disk and recorded: the staged copy may go.
        for p in done:
            self._discard(p.dump)
            remove_record(self.dump_dir, p.rid)
            self._forget(p.rid)
        self.stats.add_written(len(entries), sum(e.tokens for e in entries), sum(e.bytes for e in entries))
        self._last_activity = time.monotonic()


def torch_set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _as_int64(values: list[int]):  # -> torch.Tensor
    import torch

    return torch.tensor(values, dtype=torch.int64)


def _age(path: Path, now: float) -> float:
    """Seconds since `path` (or, for a directory, anything directly in it) was last modified."""
    try:
        latest = path.stat().st_mtime
        if path.is_dir():
            for child in _safe_iterdir(path):
                with contextlib.suppress(FileNotFoundError):
                    latest = max(latest, child.stat().st_mtime)
    except FileNotFoundError:
        return 0.0
    return now - latest


def _dump_identity(d: Path) -> dict[str, object]:
    """What tells this staged dump from any other with the same name: inode and times of its files."""
    ident: dict[str, object] = {"dump": str(d)}
    for p in [d, *sorted(_safe_iterdir(d))]:
        with contextlib.suppress(FileNotFoundError):
            st = p.stat()
            ident[p.name if p != d else "."] = [st.st_ino, st.st_size, st.st_mtime_ns]
    return ident


def _read_source(quarantined: Path) -> dict[str, object] | None:
    try:
        return json.loads((quarantined / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None


def _safe_iterdir(path: Path) -> Iterator[Path]:
    try:
        yield from path.iterdir()
    except FileNotFoundError:
        return
