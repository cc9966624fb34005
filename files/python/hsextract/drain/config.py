"""The drain's settings: its flags, declared once (hsextract.options), and what it derives.

``hsextract drain`` (hsextract.drain.command) builds them from its flags and the run configuration,
then reads the model's facts into them; tests and benches build them directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hsextract.formats import DEFAULT_PRECISION, FORMAT_NAMES, PRECISION_OPTION
from hsextract.layers import CONVENTIONS
from hsextract.options import option
from hsextract.output.accounts import DEFAULT_MAX_FAILURE_SHARE
from hsextract.output.layout import FAILURES, default_quarantine_dir
from hsextract.server_logprobs import DEFAULT_MAX_MEAN_ABS_ERROR, FP8_MAX_MEAN_ABS_ERROR

if TYPE_CHECKING:
    from hsextract.objectstore.output import ObjectOutput

# One worker per core up to 8: measured on 2 and 16 cores, more threads than cores only contend.
DEFAULT_WORKERS = max(1, min(8, os.cpu_count() or 1))
# Workers in processes (hsextract.drain.worker_processes) from this many cores: they lift the
# small-sample ceiling of one interpreter; on fewer cores their start-up and memory outweigh it.
PROCESSES_FROM_CORES = 8
WORKER_MODES = ("auto", "threads", "processes")


def optional_path(text: str | Path) -> Path | None:
    """A path flag whose empty value means "not given"."""
    return Path(text) if text else None


@dataclass
class DrainConfig:
    """What the drain runs with: its flags (each field with an `option`, in ``--help``'s order), and
    what ``hsextract drain`` derives from the model and the output (the fields without one)."""

    dump_dir: Path = option(help="staging directory the capture writes (in /dev/shm)", convert=Path)
    output: Path = option(help="training-set directory to write, or s3://bucket/prefix (docs/object-store.md)")
    format: str = option(choices=FORMAT_NAMES, help="trainer format of the training set")
    precision: str = option(DEFAULT_PRECISION, like=PRECISION_OPTION)
    # The model's directory, resolved; what every dump must look like is read from it (below).
    model_path: str = option(
        "",
        flag="--model",
        parser_default=None,
        help="model directory: hidden size, layer count and dtype every dump must match",
        convert=lambda path: str(Path(path).resolve()),
    )
    aux_layers: str | None = option(
        None, help="aux layer ids every dump must have, e.g. 1,29,57 (default: the model's)"
    )
    layer_convention: str = option("eagle", choices=CONVENTIONS, help="convention of --aux-layers")
    workers: int = option(
        DEFAULT_WORKERS, type=int, parser_default=None, help="parallel writers (default: one per core, at most 8)"
    )
    # "threads", "processes", or "auto": processes on a machine of PROCESSES_FROM_CORES cores or more.
    worker_mode: str = option(
        "auto",
        choices=WORKER_MODES,
        help="workers as threads of the drain, or as processes (each its own interpreter: faster "
        "for many small samples); auto: processes on 8 cores or more (default)",
    )
    memory_budget_bytes: int = option(
        2 << 30, flag="--memory-budget", type=int, help="bytes of samples held in memory at once"
    )
    quarantine_dir: Path | None = option(
        None, help="where invalid dumps go (default <output>/quarantine)", convert=optional_path
    )
    metrics_port: int | None = option(None, type=int, help="serve Prometheus metrics on 127.0.0.1:PORT")
    exit_when_done: bool = option(
        False,
        action="store_true",
        help="exit once the client has finished and no dump of this run is staged: 0 when the "
        "run's counts add up, 3 when they do not or too many samples failed",
    )
    # With exit_when_done: the share of accepted samples that may end failed, and (separately)
    # quarantined, before the run counts as failed (exit status RUN_CHECK_FAILED).
    max_failure_share: float = option(
        DEFAULT_MAX_FAILURE_SHARE,
        type=float,
        help="share of accepted samples that may end failed, and quarantined, before a finished "
        f"run counts as failed (default {DEFAULT_MAX_FAILURE_SHARE:g})",
    )
    record_grace_s: float = option(
        300.0,
        flag="--record-grace",
        type=float,
        help="seconds a complete dump may wait for its client record before it is removed",
    )
    incomplete_timeout_s: float = option(
        1800.0,
        flag="--incomplete-timeout",
        type=float,
        help="seconds after which a dump without done marker is quarantined",
    )
    # ...or after this, once the client has finished and listed the sample in its failures.jsonl
    # (it gave up on it: no done marker will come, and --exit-when-done should not wait 30 min).
    abandoned_grace_s: float = option(
        60.0,
        flag="--abandoned-grace",
        type=float,
        help="seconds after which a dump without done marker is quarantined once the finished "
        f"client lists its sample in {FAILURES}",
    )
    finalize_idle_s: float = option(
        60.0, flag="--finalize-idle", type=float, help="rebuild dataset-level files after this many idle seconds"
    )
    # A full scan (every dump triaged, the lag counted) at most this often.
    poll_interval_s: float = option(0.5, flag="--poll-interval", type=float, help="seconds between staging scans")
    # The greedy self-check (hsextract.drain.selfcheck): the first samples the drain sees, then this
    # share by rid, go through the model's head; needs model_path.
    selfcheck_share: float = option(
        0.01,
        type=float,
        help="share of samples whose last final hidden state is put through the model's head and "
        "must give the token the server sampled (default 0.01; fewer while the check's queue holds a "
        "pass's worth, counted as skipped for load; 1: every sample, whatever the pace; needs --model)",
    )
    selfcheck_first: int = option(
        8, type=int, help="the first samples a drain sees that are always self-checked (default 8)"
    )
    # The logprob check of the same samples (hsextract.logprob_check): the server the drain asks for
    # their prompt logprobs ("" = off), and the mean absolute error a sample may have.
    selfcheck_server: str = option(
        "",
        metavar="URL",
        help="the SGLang server the self-check asks for each checked sample's prompt logprobs, to "
        "compare with those its captured final hidden states give (the logprob check; default: "
        "none, the greedy check alone; the drain's unit passes the run's server)",
        convert=str.strip,
    )
    # None: the precision's own (hsextract.server_logprobs.bound_for)
    selfcheck_logprob_bound: float | None = option(
        None,
        type=float,
        help="the mean absolute error of a sample's compared logprobs above which it is quarantined "
        f"as logprob_mismatch (default {DEFAULT_MAX_MEAN_ABS_ERROR:g}, {FP8_MAX_MEAN_ABS_ERROR:g} for FP8 rows, "
        "checked dequantized: their rounding moves a trained model's logprobs by up to 0.1)",
    )
    uploads: int = option(8, type=int, help="with --output s3://...: samples uploaded at once (default 8)")
    s3_part_size: int = option(
        32 << 20,
        type=int,
        metavar="BYTES",
        help="with --output s3://...: a sample of two parts or more goes up in parts of this size "
        "(default 32 MiB, at least 5 MiB)",
    )
    vocab_checkpoint_interval_s: float = option(
        30.0,
        flag="--vocab-checkpoint-interval",
        type=float,
        help="seconds between checkpoints of the token counts (a restart recounts what came after)",
    )
    # What every dump must look like; None = take it from the manifest header or the first dump.
    expected_dtype: str | None = None
    expected_hidden_size: int | None = None
    eagle_layer_ids: tuple[int, ...] | None = None
    sglang_layer_ids: tuple[int, ...] | None = None
    num_hidden_layers: int | None = None
    model_config_sha256: str = ""
    # hsextract.model_fingerprint of model_path, once taken (None: not yet; the header takes it).
    model_fingerprint: dict[str, str] | None = None
    architecture: str = ""
    # Worker processes start in the background while the drain's threads prepare the first samples
    # (hsextract.drain.worker_processes); True waits for them first, so that every sample goes
    # through them (tests of the processes themselves).
    wait_for_worker_processes: bool = False
    # With a slot of the queue free, the drain looks for new dumps this often: nothing wakes it when
    # the capture stages one (measured on the H200: a client sending ~400 small samples/s staged
    # ~200 while the idle drain waited out a half-second poll, and hit its --max-staged).
    new_dumps_look_s: float = 0.05
    enospc_retry_s: float = 5.0
    status_interval_s: float = 2.0
    # Draft vocabulary (hsextract.vocab): loss-masked token counts kept with the manifest, and the
    # trainers' mapping files written at finalize for each size. vocab_size None = the header's
    # (their flags: hsextract.vocab.arguments, shared with finalize and collect).
    count_vocab: bool = True
    draft_vocab_sizes: tuple[int, ...] = (32000,)
    vocab_size: int | None = None
    # The set goes to a bucket (``--output s3://...``): `output` is then the local work directory
    # (hsextract.objectstore.output), and the samples and dataset-level files go to the bucket.
    object_store: ObjectOutput | None = None

    @property
    def worker_processes(self) -> int:
        """How many worker processes to start (0: the workers are threads of the drain)."""
        cores = os.cpu_count() or 1
        if self.worker_mode == "processes" or (self.worker_mode == "auto" and cores >= PROCESSES_FROM_CORES):
            return max(1, self.workers)
        return 0

    @property
    def worker_threads(self) -> int:
        """The drain's worker threads: the workers themselves, or, with worker processes, enough
        threads to keep every process busy while results travel back (each thread waits on one)."""
        return max(1, self.workers) * (4 if self.worker_processes else 1)

    @property
    def selfcheck_threads(self) -> int:
        """Threads of one pass of the self-check over the model's head (hsextract.greedy_check): half the
        cores, at most 8: a pass is a short burst, and at a run's end, when the last chosen samples wait
        for it, the cores are otherwise idle. Each thread holds one 64 MiB chunk of the head while it
        multiplies it (512 MiB at most, during a pass)."""
        return max(1, min(8, (os.cpu_count() or 1) // 2))

    @property
    def quarantine(self) -> Path:
        return self.quarantine_dir or default_quarantine_dir(self.output)
