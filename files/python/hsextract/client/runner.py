"""One extraction run: read the dataset, tokenize, record, send with bounded concurrency, report.

The flow per sample (the producer is the calling thread, senders are a thread pool):

1. read and validate the line (`dataset`), skip it if it belongs to another shard, reject it
   (rejects file, counted) if it is bad or a repeat;
2. skip it if the training set already has it (the manifest) or its dump is staged and complete
   from an earlier run (the drain will take it): this is what makes a restart lose nothing and
   duplicate nothing;
3. tokenize with the model's chat template and loss mask (`chat_template`), apply the length policy;
4. write the sample's record for the drain (before sending: the dump must never exist without it);
5. wait for a free in-flight slot and for the backpressure limits, then send (`in_flight`, `sender`);
6. once the server answered, wait for the capture's word (`confirm`): the dump is staged, or the
   capture failed (``failed.json``) or wrote nothing, and then the sample is sent again, up to
   the attempt limit, after which it is reported failed with the reason (`in_flight`).

Before the first sample, a probe request checks that the server's capture stages into this
client's staging directory, in the final-norm placement of the format (`probe`). The client holds
the lock of its shard of the output for its whole life (hsextract.output.lock: a client of an
overlapping shard refuses), and until those start-up checks pass it changes none of the last
run's files (`start_state`); a stop during the start ends it at once (`stoppable`).

The summary is written only once every sample of the shard has an outcome, because the drain's
``--exit-when-done`` treats it as "no more dumps will come".
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from pathlib import Path

from hsextract.client.backpressure import Backpressure
from hsextract.client.config import STAGED_ELEM_BYTES, ExtractConfig
from hsextract.client.confirm import capture_has_word
from hsextract.client.in_flight import InFlight
from hsextract.client.probe import probe_capture
from hsextract.client.progress import Reporter, RunStats
from hsextract.client.run_jsonl import RunJsonl
from hsextract.client.sender import Sender, ServerUnavailable, StopRequested
from hsextract.client.server_limit import ServerLimit, server_limit
from hsextract.client.start_state import ShardRefused, begin_run, check_earlier_shards, read_previous, record_unstarted
from hsextract.client.startup import StartupClock
from hsextract.client.stoppable import call_unless_stopped
from hsextract.dataset import defaults
from hsextract.dataset.chat_template import build_encoder
from hsextract.dataset.reader import DatasetReader, Reject, Sample, count_rows, dataset_files, read_dataset
from hsextract.durable import check_writable
from hsextract.errors import ConfigError, HsextractError
from hsextract.formats import check_precision, final_hidden_for
from hsextract.model_info import read_model_info
from hsextract.output.dataset_record import check_and_record
from hsextract.output.layout import client_summary_path, failures_path, rejects_path, state_dir
from hsextract.output.lock import ShardLock
from hsextract.output.manifest import completed_indices, read_header
from hsextract.output.run_files import ClientStatus, write_client_summary
from hsextract.output.run_id import load_or_create_run_id
from hsextract.prompt_limit import longest_prompt, resolve_max_tokens
from hsextract.staging.dumps import staged_indices
from hsextract.staging.fs import prepare_root
from hsextract.staging.records import (
    SampleRecord,
    check_prefix,
    make_rid,
    remove_record,
    write_record,
)

log = logging.getLogger("hsextract.client")


class ExtractRun:
    """A client run; `run()` returns the final stats or raises HsextractError (server gone, bad setup)."""

    def __init__(self, cfg: ExtractConfig, stop: threading.Event | None = None):
        self.startup = StartupClock()  # first: its phases start where the imports ended
        self.cfg = cfg
        self.stop = stop or threading.Event()
        check_prefix(cfg.rid_prefix)
        if cfg.max_in_flight < 1:
            raise ConfigError(f"max in flight {cfg.max_in_flight}: must be at least 1")
        final_hidden_for(cfg.format)  # an unknown format stops the run here
        check_precision(cfg.format, cfg.precision)  # and so does a precision its reader cannot read
        dataset_files(cfg.dataset)  # a missing or unusable dataset stops the run before anything else
        self.model = read_model_info(cfg.model)  # the same refusal as the drain's and the patch's
        # Up to seconds (the tokenizer's files; transformers' import where the direct path cannot be
        # taken): a stop must not wait for it.
        with self.startup.phase("tokenizer"):
            self.encoder = call_unless_stopped(
                self.stop,
                "loading the tokenizer",
                functools.partial(
                    build_encoder,
                    Path(cfg.model),
                    cfg.chat_template,
                    cfg.max_tokens,
                    cfg.overlong,
                    cfg.last_turn_only,
                    cfg.min_loss_tokens,
                    quiet=True,
                ),
            )
        self.tokenizer = self.encoder.tok
        # Resolved once: records name it for the drain, whose working directory is not this one.
        self.output = Path(cfg.output).resolve()
        self.bytes_per_token = (cfg.num_aux + 1) * self.model.hidden_size * STAGED_ELEM_BYTES + 8
        self.stats = RunStats()
        self.sender = Sender(
            cfg.server, cfg.retry, self.stop, settled=functools.partial(capture_has_word, cfg.dump_dir)
        )
        # The output's run id, read (or created) by the start-up checks once they allow it.
        self.run_id = ""
        # Built here, started or opened when the run begins (`_run_started`): a refused start
        # changes none of the last run's files and leaves no thread behind.
        self._backpressure = Backpressure(cfg.dump_dir, cfg.shm_min_free, cfg.max_staged, self.bytes_per_token)
        self._rejects = RunJsonl(rejects_path(self.output, cfg.shard))
        self._failures = RunJsonl(failures_path(self.output, cfg.shard))
        self.in_flight = InFlight(cfg, self.sender, self.stats, self._backpressure, self._failures, self.stop)

    def _reject(self, rej: Reject) -> None:
        self.stats.record_rejected(rej.reason)
        self._rejects.write(rej.to_json())

    def run(self) -> RunStats:
        """Take the shard's lock, check the start, then run; a stop before the run began returns the
        stats as stopped, with the output's client files as they were (hsextract.client.start_state)."""
        cfg = self.cfg
        check_writable(self.output, "output directory", "--output")
        prepare_root(cfg.dump_dir)  # mode 0700; one another user could have filled is refused
        try:
            with ShardLock(self.output, cfg.shard):  # a client of an overlapping shard refuses here
                return self._run_locked()
        except StopRequested:
            self.stats.finish("stopped")
            return self.stats

    def _run_locked(self) -> RunStats:
        cfg, st, out = self.cfg, self.stats, self.output
        st.shard = cfg.shard
        previous = read_previous(out, cfg.shard)
        reporter: Reporter | None = None
        try:
            clock = self.startup
            with clock.phase("output_checks"):
                run_id = self._check_output(out)
            with clock.phase("dataset_count"):
                st.dataset_lines = call_unless_stopped(
                    self.stop, "counting the dataset's rows", functools.partial(count_rows, cfg.dataset)
                )
            st.samples_total = cfg.shard.size(st.dataset_lines)
            reporter = Reporter(st, out, status_every=cfg.status_every_s, log_every=cfg.log_every_s, shard=cfg.shard)
            reporter.start()
            log.info(
                "run %s: %d samples in shard %s of %s -> %s",
                run_id,
                st.samples_total,
                cfg.shard,
                cfg.dataset,
                cfg.server,
            )
            with clock.phase("server_wait"):
                self._wait_for_server()
            with clock.phase("server_limit"):
                self._take_server_limit()
            with clock.phase("probe"):
                self._probe(run_id)
            st.startup_s = dict(clock.phases)
            log.info("start-up: %s", clock.describe())
        except BaseException as exc:
            self._unstarted(reporter, previous, exc)
            raise
        return self._run_started(out, run_id, reporter)

    def _unstarted(self, reporter: Reporter | None, previous: ClientStatus | None, exc: BaseException) -> None:
        """The start ended before its run began: refused (an error), or stopped. The status shows
        the run before it again, with the refusal; a stop before the status was first written, or
        a shard the output refused to take (of which it knew nothing before), writes nothing."""
        st = self.stats
        if reporter is not None:
            reporter.stop(final_tick=False)
        stopped = isinstance(exc, (StopRequested, KeyboardInterrupt))
        if (stopped and reporter is None) or (isinstance(exc, ShardRefused) and previous is None):
            return
        if stopped:
            st.finish("stopped")
        else:
            st.finish("failed", str(exc))
        record_unstarted(self.output, self.cfg.shard, previous, st.status(), None if stopped else str(exc))

    def _run_started(self, out: Path, run_id: str, reporter: Reporter) -> RunStats:
        cfg, st = self.cfg, self.stats
        for path in begin_run(out, cfg.shard):
            log.info("removed %s: a client file of an overlapping shard, superseded by this run's", path)
        self._rejects.open()
        self._failures.open()
        self.in_flight.start()
        try:
            # staging first, then the manifest: a dump drained in between is in the second
            skip = staged_indices(Path(cfg.dump_dir), cfg.rid_prefix, run_id) | completed_indices(out)
            self._produce(run_id, skip)
        except ServerUnavailable as exc:
            self.in_flight.fatal = exc
            self.stop.set()
        except StopRequested:
            pass  # asked to stop while waiting for the server: a plain stop
        except BaseException:
            self.stop.set()  # Ctrl-C or a bug: not done, so no summary
            raise
        finally:
            self.in_flight.close()
            self._settle_state()
            reporter.stop()
            self._rejects.close()
            self._failures.close()
        if st.state == "done":
            write_client_summary(client_summary_path(out, cfg.shard), st.summary_record())
        fatal = self.in_flight.fatal
        if isinstance(fatal, HsextractError):
            raise fatal
        if fatal is not None:
            raise HsextractError(f"client stopped on an internal error: {fatal!r}") from fatal
        return st

    def _check_output(self, out: Path) -> str:
        """The checks of the output directory that change none of its client files; the run id."""
        cfg = self.cfg
        header = read_header(out)
        if header is not None and header.format != cfg.format:
            raise ConfigError(
                f"output directory {out} holds a {header.format!r} training set, but this client runs "
                f"with --format {cfg.format}; use the format of the set, or a new output directory"
            )
        if header is not None and header.precision != cfg.precision:
            raise ConfigError(
                f"output directory {out} holds a training set of {header.precision} rows, but this client runs "
                f"with --precision {cfg.precision}; use the precision of the set, or a new output directory"
            )
        # Before anything in the output changes: resuming by index from another dataset is refused,
        # and so is a shard whose run would drop the accounts of an earlier, wider one.
        check_earlier_shards(out, cfg.shard, cfg.host_shard or cfg.shard)
        check_and_record(out, Path(cfg.dataset), has_samples=header is not None)
        self.run_id = load_or_create_run_id(out)
        self._backpressure.run_id = self.run_id  # it counts this run's dumps
        state_dir(out).mkdir(parents=True, exist_ok=True)
        return self.run_id

    def _wait_for_server(self) -> None:
        """Under systemd the client may start before the server is up. A server that answers
        /server_info is up (milliseconds); /health, which takes a second, only decides otherwise."""
        gate = self.sender.gate
        if not (gate.up_now() or gate.probe()):
            with self.stats.paused(f"waiting for the server {self.cfg.server} to answer /health"):
                gate.wait_healthy(since=time.monotonic())

    def _take_server_limit(self) -> None:
        """Cut samples to what the running server accepts (`hsextract.prompt_limit`): the figure
        computed from the model's config at start does not know the server's own settings."""
        context = self.model.context_length
        limit = server_limit(self.cfg.server, context, self.cfg.retry.connect_timeout_s) or ServerLimit(
            longest_prompt(context), f"SGLang's rule for the model's context of {context}"
        )
        self.encoder.max_tokens = resolve_max_tokens(
            self.cfg.max_tokens, defaults.MAX_TOKENS, limit.longest, limit.source
        )
        log.info(
            "samples longer than %d tokens are %s (the server runs at most %d: %s)",
            self.encoder.max_tokens,
            "cut" if self.cfg.overlong == "truncate" else "rejected",
            limit.longest,
            limit.source,
        )

    def _settle_state(self) -> None:
        """The run's final state: failed (with the error), stopped, or done."""
        if self.in_flight.fatal is not None:
            self.stats.finish("failed", str(self.in_flight.fatal))
        elif self.stop.is_set():
            self.stats.finish("stopped")
        else:
            self.stats.finish("done")

    def _probe(self, run_id: str) -> None:
        cfg = self.cfg
        ids = list(
            self.tokenizer("hsextract start-up probe: is the capture writing here?", add_special_tokens=True)[
                "input_ids"
            ]
        )
        with self.stats.paused("checking that the capture stages into this client's staging directory"):
            result = probe_capture(
                self.sender,
                Path(cfg.dump_dir),
                cfg.rid_prefix,
                run_id,
                cfg.format,
                self.model.hidden_size,
                ids,
                cfg.probe_timeout_s,
            )
        log.info(
            "start-up probe: the capture stages %s final hidden states into %s (%.1f s)",
            result.final_hidden,
            cfg.dump_dir,
            result.seconds,
        )

    def _produce(self, run_id: str, skip: set[int]) -> None:
        cfg = self.cfg
        reader = DatasetReader(max_row_bytes=cfg.max_row_bytes)
        for item in read_dataset(cfg.dataset, reader):  # every row, for shard-independent duplicate detection
            if self.stop.is_set() or not self.in_flight.send_again():
                return
            if cfg.shard.takes(item.index) and not self._produce_one(item, run_id, skip):
                return
        self.in_flight.wait_for_answers()

    def _produce_one(self, item: Sample | Reject, run_id: str, skip: set[int]) -> bool:
        """Reject, skip or send one row of this host's shard; False when a stop came before it was sent."""
        cfg, st = self.cfg, self.stats
        if isinstance(item, Reject):
            self._reject(item)
            return True
        index = item.index
        if index in skip:
            st.record_skipped()
            return True
        enc = self.encoder.encode(item)
        if isinstance(enc, Reject):
            self._reject(enc)
            return True
        if enc.truncated_from:
            st.record_truncated()
        rid = make_rid(cfg.rid_prefix, run_id, index)
        enc.file, enc.line = item.file, item.line
        write_record(
            cfg.dump_dir,
            SampleRecord(rid, index, enc.input_ids, enc.loss_mask, run_id, item.source, cfg.format, str(self.output)),
        )
        if not self.in_flight.send(rid, enc):
            remove_record(cfg.dump_dir, rid)  # never sent; the restarted run writes it again
            return False
        return True
