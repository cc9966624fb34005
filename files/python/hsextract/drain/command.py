"""``hsextract drain``: the foreground daemon systemd runs beside the server.

SIGTERM (systemctl stop) finishes the samples in hand, commits them and exits 0; a restart
recovers from any crash (see hsextract.drain.core).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path
from urllib.parse import urlsplit

from hsextract import shutdown
from hsextract.config_file import add_config_argument
from hsextract.draft_config import serving_layer_ids
from hsextract.drain import forkserver
from hsextract.drain.config import WORKER_MODES
from hsextract.errors import ConfigError
from hsextract.formats import FORMAT_NAMES
from hsextract.layers import CONVENTIONS, parse_ids, resolve
from hsextract.objectstore.output import resolve_output
from hsextract.objectstore.settings import add_store_arguments
from hsextract.output.accounts import DEFAULT_MAX_FAILURE_SHARE
from hsextract.output.layout import FAILURES
from hsextract.server_logprobs import DEFAULT_MAX_MEAN_ABS_ERROR
from hsextract.vocab.arguments import add_draft_vocab_arguments, draft_vocab_settings

log = logging.getLogger("hsextract.drain")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dump-dir", required=False, help="staging directory the capture writes (in /dev/shm)")
    parser.add_argument(
        "--output", required=False, help="training-set directory to write, or s3://bucket/prefix (docs/object-store.md)"
    )
    parser.add_argument("--format", choices=FORMAT_NAMES, help="trainer format of the training set")
    parser.add_argument("--model", help="model directory: hidden size, layer count and dtype every dump must match")
    parser.add_argument("--aux-layers", help="aux layer ids every dump must have, e.g. 1,29,57 (default: the model's)")
    parser.add_argument("--layer-convention", choices=CONVENTIONS, default="eagle", help="convention of --aux-layers")
    parser.add_argument("--workers", type=int, default=None, help="parallel writers (default: one per core, at most 8)")
    parser.add_argument(
        "--worker-mode",
        choices=WORKER_MODES,
        default="auto",
        help="workers as threads of the drain, or as processes (each its own interpreter: faster "
        "for many small samples); auto: processes on 8 cores or more (default)",
    )
    parser.add_argument("--memory-budget", type=int, default=2 << 30, help="bytes of samples held in memory at once")
    parser.add_argument("--quarantine-dir", help="where invalid dumps go (default <output>/quarantine)")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on 127.0.0.1:PORT")
    parser.add_argument(
        "--exit-when-done",
        action="store_true",
        help="exit once the client has finished and no dump of this run is staged: 0 when the "
        "run's counts add up, 3 when they do not or too many samples failed",
    )
    parser.add_argument(
        "--max-failure-share",
        type=float,
        default=DEFAULT_MAX_FAILURE_SHARE,
        help="share of accepted samples that may end failed, and quarantined, before a finished "
        f"run counts as failed (default {DEFAULT_MAX_FAILURE_SHARE:g})",
    )
    parser.add_argument(
        "--record-grace",
        type=float,
        default=300.0,
        help="seconds a complete dump may wait for its client record before it is removed",
    )
    parser.add_argument(
        "--incomplete-timeout",
        type=float,
        default=1800.0,
        help="seconds after which a dump without done marker is quarantined",
    )
    parser.add_argument(
        "--abandoned-grace",
        type=float,
        default=60.0,
        help="seconds after which a dump without done marker is quarantined once the finished "
        f"client lists its sample in {FAILURES}",
    )
    parser.add_argument(
        "--finalize-idle", type=float, default=60.0, help="rebuild dataset-level files after this many idle seconds"
    )
    parser.add_argument("--poll-interval", type=float, default=0.5, help="seconds between staging scans")
    parser.add_argument(
        "--selfcheck-share",
        type=float,
        default=0.01,
        help="share of samples whose last final hidden state is put through the model's head and "
        "must give the token the server sampled (default 0.01; fewer while the check's queue holds a "
        "pass's worth, counted as skipped for load; 1: every sample, whatever the pace; needs --model)",
    )
    parser.add_argument(
        "--selfcheck-first",
        type=int,
        default=8,
        help="the first samples a drain sees that are always self-checked (default 8)",
    )
    parser.add_argument(
        "--selfcheck-server",
        metavar="URL",
        help="the SGLang server the self-check asks for each checked sample's prompt logprobs, to "
        "compare with those its captured final hidden states give (the logprob check; default: "
        "none, the greedy check alone; the drain's unit passes the run's server)",
    )
    parser.add_argument(
        "--selfcheck-logprob-bound",
        type=float,
        default=DEFAULT_MAX_MEAN_ABS_ERROR,
        help="the mean absolute error of a sample's compared logprobs above which it is quarantined "
        f"as logprob_mismatch (default {DEFAULT_MAX_MEAN_ABS_ERROR:g})",
    )
    add_draft_vocab_arguments(parser)
    add_store_arguments(parser)
    parser.add_argument(
        "--uploads", type=int, default=8, help="with --output s3://...: samples uploaded at once (default 8)"
    )
    parser.add_argument(
        "--s3-part-size",
        type=int,
        default=32 << 20,
        metavar="BYTES",
        help="with --output s3://...: a sample of two parts or more goes up in parts of this size "
        "(default 32 MiB, at least 5 MiB)",
    )
    parser.add_argument(
        "--vocab-checkpoint-interval",
        type=float,
        default=30.0,
        help="seconds between checkpoints of the token counts (a restart recounts what came after)",
    )
    add_config_argument(parser)


def check_selfcheck_server(url: str, bound: float) -> None:
    """ConfigError unless the logprob check's URL and bound can be used."""
    parts = urlsplit(url)
    if url and (parts.scheme not in ("http", "https") or not parts.hostname):
        raise ConfigError(f"--selfcheck-server {url!r}: give the server's URL, e.g. http://127.0.0.1:30000")
    if not bound > 0:
        raise ConfigError(f"--selfcheck-logprob-bound {bound}: give a mean absolute error above 0")


def build_config(args: argparse.Namespace):  # -> DrainConfig
    from hsextract.drain.config import DrainConfig
    from hsextract.staging.dumps import DTYPE_BYTES

    missing = [f"--{n.replace('_', '-')}" for n in ("dump_dir", "output", "format") if not getattr(args, n, None)]
    if missing:
        raise ConfigError(f"drain needs {', '.join(missing)} (on the command line or in --config)")
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: give at least 1")
    output, bucket = resolve_output(args.output, args)
    if bucket is not None:
        if args.uploads < 1:
            raise ConfigError(f"--uploads {args.uploads}: give at least 1")
        if args.s3_part_size < 5 << 20:
            raise ConfigError(f"--s3-part-size {args.s3_part_size}: S3's smallest part is 5 MiB (5242880 bytes)")
        bucket = dataclasses.replace(bucket, uploads=args.uploads, part_size=args.s3_part_size)
        output.mkdir(parents=True, exist_ok=True)
    cfg = DrainConfig(
        dump_dir=Path(args.dump_dir),
        output=output,
        object_store=bucket,
        format=args.format,
        memory_budget_bytes=args.memory_budget,
        quarantine_dir=Path(args.quarantine_dir) if args.quarantine_dir else None,
        metrics_port=args.metrics_port,
        exit_when_done=bool(args.exit_when_done),
        max_failure_share=float(args.max_failure_share),
        record_grace_s=args.record_grace,
        incomplete_timeout_s=args.incomplete_timeout,
        abandoned_grace_s=args.abandoned_grace,
        finalize_idle_s=args.finalize_idle,
        poll_interval_s=args.poll_interval,
        worker_mode=args.worker_mode,
        selfcheck_share=float(args.selfcheck_share),
        selfcheck_first=int(args.selfcheck_first),
        selfcheck_server=(args.selfcheck_server or "").strip(),
        selfcheck_logprob_bound=float(args.selfcheck_logprob_bound),
    )
    if not 0.0 <= cfg.selfcheck_share <= 1.0 or cfg.selfcheck_first < 0:
        raise ConfigError(
            f"--selfcheck-share {args.selfcheck_share} / --selfcheck-first {args.selfcheck_first}: "
            "give a share from 0 to 1 and a count of at least 0"
        )
    check_selfcheck_server(cfg.selfcheck_server, cfg.selfcheck_logprob_bound)
    if args.workers:
        cfg.workers = args.workers
    cfg.draft_vocab_sizes, cfg.vocab_size = draft_vocab_settings(args)
    cfg.count_vocab = not args.no_draft_vocab
    cfg.vocab_checkpoint_interval_s = args.vocab_checkpoint_interval
    ids = parse_ids(args.aux_layers)
    if args.model:
        from hsextract.model_info import read_model_info

        info = read_model_info(args.model)
        layers = resolve(ids, info.num_hidden_layers, args.layer_convention)
        serving_layer_ids(info.architecture, layers.sglang_layers_to_capture)  # a set no drafter can be served on
        cfg.expected_hidden_size = info.hidden_size
        cfg.expected_dtype = info.torch_dtype if info.torch_dtype in DTYPE_BYTES else None
        cfg.eagle_layer_ids = layers.eagle_aux_hidden_state_layer_ids
        cfg.sglang_layer_ids = layers.sglang_layers_to_capture
        cfg.num_hidden_layers = info.num_hidden_layers
        cfg.model_path = str(Path(args.model).resolve())
        cfg.model_config_sha256 = info.config_sha256
        cfg.architecture = info.architecture
        cfg.vocab_size = cfg.vocab_size or info.vocab_size or None
    elif ids is not None:
        layers = resolve(ids, None, args.layer_convention)  # the range checks that need no model
        cfg.eagle_layer_ids = layers.eagle_aux_hidden_state_layer_ids
        cfg.sglang_layer_ids = layers.sglang_layers_to_capture
    return cfg


def run(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    if cfg.worker_processes:
        # Before the drain's own imports, so that the server's imports run beside them (hsextract.drain.forkserver).
        forkserver.start()
    from hsextract.drain.core import Drainer

    drainer = Drainer(cfg)
    # SIGTERM/SIGINT, also one that came during the imports: finish the samples in hand, then stop
    shutdown.on_stop(drainer.stop)
    return drainer.run()
