"""``hsextract extract``: the command the extraction client's systemd unit (or a person) runs.

Every flag can also come from the shared run configuration (``--config FILE``, keys = flag names
with underscores), which is how the Ansible role keeps the client, the server patch and the
drain in agreement on the dump dir, output directory, model and rid prefix.
"""

from __future__ import annotations

import argparse
import json
import sys

from hsextract import shutdown
from hsextract.client.config import ExtractConfig
from hsextract.client.runner import ExtractRun
from hsextract.client.sender import StopRequested
from hsextract.config_file import add_config_argument
from hsextract.errors import ConfigError
from hsextract.objectstore.output import resolve_output
from hsextract.options import add_options, missing_options, options_from
from hsextract.output.layout import problem_files
from hsextract.report import client_lines
from hsextract.shard import WHOLE, Shard, parse_process


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, ExtractConfig)
    add_config_argument(parser)


def config_from_args(args: argparse.Namespace) -> ExtractConfig:
    missing = missing_options(ExtractConfig, args)
    if missing:
        raise ConfigError(f"hsextract extract needs {', '.join(missing)} (as flags or keys of --config)")
    return options_from(
        ExtractConfig,
        args,
        output=resolve_output(args.output, args)[0],
        shard=_shard(args),
        host_shard=Shard.parse(args.shard, where="--shard"),
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
