"""``hsextract extract``: the command the extraction client's systemd unit (or a person) runs.

Every flag can also come from the shared run configuration (``--config FILE``, keys = flag names
with underscores), which is how the Ansible role keeps the client, the server patch and the
drain in agreement on the dump dir, output directory, model and rid prefix.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import MISSING
from pathlib import Path
from typing import Any

from hsextract import shutdown
from hsextract.client.backpressure import parse_watermark
from hsextract.client.config import ExtractConfig
from hsextract.client.runner import ExtractRun
from hsextract.client.sender import StopRequested
from hsextract.config_file import add_config_argument
from hsextract.dataset import defaults
from hsextract.dataset.chat_template import OVERLONG_POLICIES, read_template_file
from hsextract.dataset.reader import add_max_row_bytes_argument
from hsextract.errors import ConfigError
from hsextract.formats import FORMAT_NAMES
from hsextract.layers import parse_ids
from hsextract.objectstore.output import resolve_output
from hsextract.objectstore.settings import add_work_dir_argument
from hsextract.output.layout import problem_files
from hsextract.report import client_lines
from hsextract.retry import RetryPolicy
from hsextract.shard import WHOLE, Shard, parse_process

REQUIRED = ("server", "dataset", "model", "dump_dir", "output", "format")


def _default(name: str) -> Any:
    """The default of an ExtractConfig field: the one source of the CLI's and the roles' defaults."""
    f = ExtractConfig.__dataclass_fields__[name]
    return f.default_factory() if f.default_factory is not MISSING else f.default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    retry = _default("retry")
    g = parser.add_argument_group("run")
    g.add_argument("--server", help="SGLang server base URL, e.g. http://127.0.0.1:30000")
    g.add_argument(
        "--dataset",
        help="dataset file or directory: JSONL (.gz, .zst), JSON array, Parquet, Arrow, "
        "save_to_disk; ShareGPT, OpenAI messages (tools, reasoning) or pre-tokenized rows",
    )
    g.add_argument("--model", help="the served model's directory (its tokenizer and chat template are used)")
    g.add_argument("--dump-dir", help="the capture's staging directory (records are written there too)")
    g.add_argument(
        "--output",
        help="the training set's output directory (shared with the drain), or "
        "s3://bucket/prefix: then the client works in the drain's --work-dir",
    )
    add_work_dir_argument(g)
    g.add_argument(
        "--format",
        choices=FORMAT_NAMES,
        help="the training set's format (the drain's); the capture must stage what it needs",
    )
    g.add_argument(
        "--rid-prefix",
        default=_default("rid_prefix"),
        help=f"request id prefix the capture writes (default: {_default('rid_prefix')})",
    )
    g.add_argument("--chat-template", metavar="FILE", help="Jinja chat template to use instead of the tokenizer's")
    g.add_argument("--shard", default="0/1", help="take samples with index %% n == i (i/n; default 0/1)")
    g.add_argument(
        "--process",
        metavar="J/P",
        help="run as client process j of P on this shard (default 0/1): one process may not keep a "
        "large server busy (data parallelism), so P processes on one output each take every Pth "
        "sample of the shard, the sub-shard (i + n*j)/(n*P), with one run id and exact accounts",
    )
    g.add_argument(
        "--last-turn-only",
        action="store_true",
        help="train on the last assistant turn only (conversations; a tokenized row keeps its mask)",
    )
    g.add_argument(
        "--min-loss-tokens",
        type=int,
        default=0,
        help="reject samples with fewer trained-on tokens (reason too_few_loss_tokens; default 0)",
    )
    s = parser.add_argument_group("limits")
    s.add_argument(
        "--max-in-flight",
        type=int,
        default=_default("max_in_flight"),
        help=f"requests in flight at once (default {_default('max_in_flight')})",
    )
    s.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help=f"longest sample in tokens (default {defaults.MAX_TOKENS}, or the longest prompt the "
        "server runs if fewer; a larger value is lowered to it)",
    )
    add_max_row_bytes_argument(s)
    s.add_argument(
        "--overlong",
        choices=OVERLONG_POLICIES,
        default=_default("overlong"),
        help=f"what to do with longer samples (default: {_default('overlong')})",
    )
    s.add_argument(
        "--shm-min-free",
        default=str(_default("shm_min_free")),
        help="pause while the dump dir's filesystem has less free space (bytes like 2G, or a "
        f"percentage; default {str(_default('shm_min_free')).replace('%', '%%')})",
    )
    s.add_argument(
        "--aux-layers",
        help="the capture's aux layer ids, e.g. 1,29,57 (only sizes the staging reserve; default: 3 layers)",
    )
    s.add_argument(
        "--max-staged",
        type=int,
        default=_default("max_staged"),
        help=f"pause while staged dumps + requests in flight reach this many (0: no limit; default "
        f"{_default('max_staged')})",
    )
    r = parser.add_argument_group("retries")
    r.add_argument(
        "--max-attempts",
        type=int,
        default=retry.max_attempts,
        help=f"tries per sample while the server is up (default {retry.max_attempts})",
    )
    r.add_argument(
        "--server-wait",
        type=float,
        default=retry.server_wait_s,
        help=f"seconds to wait for a down server before giving up (default {retry.server_wait_s:g})",
    )
    r.add_argument(
        "--request-timeout",
        type=float,
        default=retry.read_timeout_s,
        help="seconds without an answer before the client asks the server's /health: a healthy "
        "server keeps the request (waited on up to --server-wait), one that is not gets it again "
        f"once it is healthy (default {retry.read_timeout_s:g})",
    )
    r.add_argument(
        "--probe-timeout",
        type=float,
        default=_default("probe_timeout_s"),
        help="seconds the start-up probe's dump may take to appear in --dump-dir "
        f"(default {_default('probe_timeout_s'):g})",
    )
    r.add_argument(
        "--capture-timeout",
        type=float,
        default=_default("capture_timeout_s"),
        help="seconds an answered sample may wait for its staged dump before it is sent again "
        f"(default {_default('capture_timeout_s'):g})",
    )
    p = parser.add_argument_group("progress")
    p.add_argument(
        "--log-every",
        type=float,
        default=_default("log_every_s"),
        help=f"seconds between progress log lines off a terminal (default {_default('log_every_s'):g})",
    )
    add_config_argument(parser)


def config_from_args(args: argparse.Namespace) -> ExtractConfig:
    missing = [f"--{k.replace('_', '-')}" for k in REQUIRED if not getattr(args, k, None)]
    if missing:
        raise ConfigError(f"hsextract extract needs {', '.join(missing)} (as flags or keys of --config)")
    template = read_template_file(args.chat_template)
    return ExtractConfig(
        server=args.server,
        dataset=Path(args.dataset),
        model=Path(args.model),
        dump_dir=Path(args.dump_dir),
        output=resolve_output(args.output, args)[0],
        format=args.format,
        rid_prefix=args.rid_prefix,
        max_in_flight=int(args.max_in_flight),
        max_tokens=args.max_tokens,
        max_row_bytes=int(args.max_row_bytes),
        overlong=args.overlong,
        shard=_shard(args),
        shm_min_free=parse_watermark(args.shm_min_free),
        max_staged=int(args.max_staged) or None,
        chat_template=template,
        last_turn_only=bool(args.last_turn_only),
        min_loss_tokens=int(args.min_loss_tokens or 0),
        num_aux=_count_layers(args.aux_layers),
        retry=RetryPolicy(
            max_attempts=int(args.max_attempts),
            server_wait_s=float(args.server_wait),
            read_timeout_s=float(args.request_timeout),
        ),
        capture_timeout_s=float(args.capture_timeout),
        probe_timeout_s=float(args.probe_timeout),
        log_every_s=float(args.log_every),
    )


def _shard(args: argparse.Namespace) -> Shard:
    """The shard this process takes: ``--shard`` (or the config's), narrowed by ``--process`` to its sub-shard."""
    shard = Shard.parse(args.shard, where="--shard")
    if not getattr(args, "process", None):
        return shard
    try:
        return shard.sub_shard(parse_process(args.process))
    except ConfigError as exc:
        where = f" (of shard {shard})" if shard != WHOLE else ""
        raise ConfigError(f"--process{where}: {exc}") from None


def _count_layers(text: str | None) -> int:
    ids = parse_ids(text)
    return len(ids) if ids else defaults.NUM_AUX


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    # systemd stops the unit with SIGTERM: finish the requests in flight, then exit 0 (the CLI
    # turned the signal into this event before the imports, see hsextract.shutdown). A stop before
    # the run began (loading the tokenizer, reading the dataset, the probe) ends it at once.
    try:
        run_ = ExtractRun(cfg, shutdown.requested())
    except StopRequested as stopped:
        print(f"The client was stopped before its run began ({stopped}); nothing was sent or written.", file=sys.stderr)
        return 0
    try:
        stats = run_.run()
    except KeyboardInterrupt:
        run_.stop.set()
        raise
    # People read the report (the journal under systemd); machines read the JSON summary on stdout.
    print("\n".join(client_lines(stats.snapshot(), problem_files(cfg.output, shards=[cfg.shard]))), file=sys.stderr)
    print(json.dumps(stats.summary(), sort_keys=True))
    return 0
