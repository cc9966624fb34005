"""``hsextract drain``: the foreground daemon systemd runs beside the server.

SIGTERM (systemctl stop) finishes the samples in hand, commits them and exits 0; a restart
recovers from any crash (see hsextract.drain.core).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from urllib.parse import urlsplit

from hsextract import shutdown
from hsextract.config_file import add_config_argument
from hsextract.draft_config import serving_layer_ids
from hsextract.drain import forkserver
from hsextract.drain.config import DrainConfig
from hsextract.errors import ConfigError
from hsextract.formats import check_dtype, check_precision
from hsextract.layers import parse_ids, resolve
from hsextract.objectstore.output import resolve_output
from hsextract.objectstore.settings import add_store_arguments
from hsextract.options import add_options, missing_options, options_from
from hsextract.vocab.arguments import add_draft_vocab_arguments, draft_vocab_settings

log = logging.getLogger("hsextract.drain")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, DrainConfig)
    add_draft_vocab_arguments(parser)
    add_store_arguments(parser)
    add_config_argument(parser)


def check_selfcheck_server(url: str, bound: float | None) -> None:
    """ConfigError unless the logprob check's URL and bound can be used."""
    parts = urlsplit(url)
    if url and (parts.scheme not in ("http", "https") or not parts.hostname):
        raise ConfigError(f"--selfcheck-server {url!r}: give the server's URL, e.g. http://127.0.0.1:30000")
    if bound is not None and not bound > 0:
        raise ConfigError(f"--selfcheck-logprob-bound {bound}: give a mean absolute error above 0")


def build_config(args: argparse.Namespace) -> DrainConfig:
    missing = missing_options(DrainConfig, args)
    if missing:
        raise ConfigError(f"drain needs {', '.join(missing)} (on the command line or in --config)")
    output, bucket = resolve_output(args.output, args)
    sizes, vocab_size = draft_vocab_settings(args)
    cfg: DrainConfig = options_from(
        DrainConfig,
        args,
        output=output,
        draft_vocab_sizes=sizes,
        vocab_size=vocab_size,
        count_vocab=not args.no_draft_vocab,
    )
    check_settings(cfg)
    if bucket is not None:
        cfg.object_store = dataclasses.replace(bucket, uploads=cfg.uploads, part_size=cfg.s3_part_size)
        output.mkdir(parents=True, exist_ok=True)
    read_model_facts(cfg)
    return cfg


def check_settings(cfg: DrainConfig) -> None:
    """ConfigError for a setting the drain cannot run with, naming its flag."""
    check_precision(cfg.format, cfg.precision)
    if cfg.workers < 1:
        raise ConfigError(f"--workers {cfg.workers}: give at least 1")
    if cfg.uploads < 1:
        raise ConfigError(f"--uploads {cfg.uploads}: give at least 1")
    if cfg.s3_part_size < 5 << 20:
        raise ConfigError(f"--s3-part-size {cfg.s3_part_size}: S3's smallest part is 5 MiB (5242880 bytes)")
    if not 0.0 <= cfg.selfcheck_share <= 1.0 or cfg.selfcheck_first < 0:
        raise ConfigError(
            f"--selfcheck-share {cfg.selfcheck_share} / --selfcheck-first {cfg.selfcheck_first}: "
            "give a share from 0 to 1 and a count of at least 0"
        )
    check_selfcheck_server(cfg.selfcheck_server, cfg.selfcheck_logprob_bound)


def read_model_facts(cfg: DrainConfig) -> None:
    """What every dump must look like, from --model (its width, depth, dtype, the layer ids in both
    conventions) or, without one, the layer ids of --aux-layers alone."""
    ids = parse_ids(cfg.aux_layers)
    if cfg.model_path:
        from hsextract.model_info import read_model_info
        from hsextract.staging.dumps import DTYPE_BYTES

        info = read_model_info(cfg.model_path)
        layers = resolve(ids, info.num_hidden_layers, cfg.layer_convention)
        serving_layer_ids(info.architecture, layers.sglang_layers_to_capture)  # a set no drafter can be served on
        cfg.expected_hidden_size = info.hidden_size
        cfg.expected_dtype = info.torch_dtype if info.torch_dtype in DTYPE_BYTES else None
        if cfg.expected_dtype:
            check_dtype(cfg.format, cfg.expected_dtype, where=f"the model {cfg.model_path}")
        cfg.num_hidden_layers = info.num_hidden_layers
        cfg.model_config_sha256 = info.config_sha256
        cfg.architecture = info.architecture
        cfg.vocab_size = cfg.vocab_size or info.vocab_size or None
    elif ids is not None:
        layers = resolve(ids, None, cfg.layer_convention)  # the range checks that need no model
    else:
        return
    cfg.eagle_layer_ids = layers.eagle_aux_hidden_state_layer_ids
    cfg.sglang_layer_ids = layers.sglang_layers_to_capture


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
