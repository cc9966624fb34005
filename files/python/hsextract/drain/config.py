"""The drain's settings (``hsextract drain`` builds them from its flags and the run config)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hsextract.output.accounts import DEFAULT_MAX_FAILURE_SHARE
from hsextract.output.layout import default_quarantine_dir
from hsextract.server_logprobs import DEFAULT_MAX_MEAN_ABS_ERROR

if TYPE_CHECKING:
    from hsextract.objectstore.output import ObjectOutput

# One worker per core up to 8: measured on 2 and 16 cores, more threads than cores only contend.
DEFAULT_WORKERS = max(1, min(8, os.cpu_count() or 1))
# Workers in processes (hsextract.drain.worker_processes) from this many cores: they lift the
# small-sample ceiling of one interpreter; on fewer cores their start-up and memory outweigh it.
PROCESSES_FROM_CORES = 8
WORKER_MODES = ("auto", "threads", "processes")


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
    # hsextract.model_fingerprint of model_path, once taken (None: not yet; the header takes it).
    model_fingerprint: dict[str, str] | None = None
    architecture: str = ""
    quarantine_dir: Path | None = None
    workers: int = DEFAULT_WORKERS
    # "threads", "processes", or "auto": processes on a machine of PROCESSES_FROM_CORES cores or more.
    worker_mode: str = "auto"
    # Worker processes start in the background while the drain's threads prepare the first samples
    # (hsextract.drain.worker_processes); True waits for them first, so that every sample goes
    # through them (tests of the processes themselves).
    wait_for_worker_processes: bool = False
    memory_budget_bytes: int = 2 << 30
    # A full scan (every dump triaged, the lag counted) at most this often.
    poll_interval_s: float = 0.5
    # With a slot of the queue free, the drain looks for new dumps this often: nothing wakes it when
    # the capture stages one (measured on the H200: a client sending ~400 small samples/s staged
    # ~200 while the idle drain waited out a half-second poll, and hit its --max-staged).
    new_dumps_look_s: float = 0.05
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
    # With exit_when_done: the share of accepted samples that may end failed, and (separately)
    # quarantined, before the run counts as failed (exit status RUN_CHECK_FAILED).
    max_failure_share: float = DEFAULT_MAX_FAILURE_SHARE
    # Draft vocabulary (hsextract.vocab): loss-masked token counts kept with the manifest, and the
    # trainers' mapping files written at finalize for each size. vocab_size None = the header's.
    count_vocab: bool = True
    draft_vocab_sizes: tuple[int, ...] = (32000,)
    vocab_size: int | None = None
    vocab_checkpoint_interval_s: float = 30.0
    # The greedy self-check (hsextract.drain.selfcheck): the first samples the drain sees, then this
    # share by rid, go through the model's head; needs model_path.
    selfcheck_share: float = 0.01
    selfcheck_first: int = 8
    # The logprob check of the same samples (hsextract.logprob_check): the server the drain asks for
    # their prompt logprobs ("" = off), and the mean absolute error a sample may have.
    selfcheck_server: str = ""
    selfcheck_logprob_bound: float = DEFAULT_MAX_MEAN_ABS_ERROR
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
