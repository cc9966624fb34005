"""``hsextract regenerate``: the served model writes the replies of a dataset, which extract then reads.

Every flag can also come from the shared run configuration (``--config FILE``, keys = flag names
with underscores), as for ``hsextract extract``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hsextract import shutdown
from hsextract.config_file import add_config_argument
from hsextract.dataset.reader import add_max_row_bytes_argument
from hsextract.errors import ConfigError
from hsextract.output.layout import REGEN_OUTPUT, STATE_DIR
from hsextract.regen.progress import progress_line
from hsextract.regen.reasoning import MODES
from hsextract.regen.runner import REPLY_TIMEOUT_S, RegenConfig, RegenerateRun
from hsextract.regen.sampling import DEFAULT_MAX_NEW_TOKENS
from hsextract.retry import RetryPolicy
from hsextract.shard import Shard


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("run")
    g.add_argument(
        "--dataset",
        help="what hsextract extract reads: a file or directory of JSONL (.gz, .zst), JSON "
        "arrays, Parquet, Arrow or save_to_disk; a row without a reply gets one",
    )
    # its own config key: a shared run configuration's "output" is the training set, not this
    g.add_argument(
        "--output",
        dest="regen_output",
        help=f"directory of the regenerated dataset ({REGEN_OUTPUT}; state in {STATE_DIR}/); config key regen_output",
    )
    g.add_argument(
        "--server", action="append", help="SGLang server base URL; repeat to spread the run over several servers"
    )
    g.add_argument(
        "--model",
        help="the served model's directory, for the sampling defaults of its "
        "generation_config.json (default: the path the server names, when it exists here)",
    )
    g.add_argument("--shard", default="0/1", help="take rows with index %% n == i (i/n; default 0/1)")
    add_max_row_bytes_argument(g)
    t = parser.add_argument_group("turns")
    t.add_argument("--last-turn-only", action="store_true", help="regenerate only the last assistant turn")
    t.add_argument(
        "--reasoning",
        choices=MODES,
        default="strip-history",
        help="keep: reasoning stays in the history of later turns; strip-history (default): it is stored "
        "but not sent back; disable: thinking off (enable_thinking: false)",
    )
    t.add_argument(
        "--drop-truncated",
        action="store_true",
        help="cut a conversation before a reply that hit the token limit (default: keep it, marked)",
    )
    s = parser.add_argument_group("sampling (default: the model's generation_config.json, else greedy)")
    s.add_argument("--temperature", type=float)
    s.add_argument("--top-p", type=float)
    s.add_argument("--top-k", type=int)
    s.add_argument(
        "--max-new-tokens",
        type=int,
        default=DEFAULT_MAX_NEW_TOKENS,
        help=f"longest reply (default {DEFAULT_MAX_NEW_TOKENS}, at most the context)",
    )
    r = parser.add_argument_group("requests")
    r.add_argument("--concurrency", type=int, default=64, help="conversations in flight per server (default 64)")
    r.add_argument("--max-attempts", type=int, default=5, help="tries per turn while the server is up (default 5)")
    r.add_argument(
        "--server-wait",
        type=float,
        default=3600.0,
        help="seconds to wait for a down server before giving it up (default 3600)",
    )
    r.add_argument(
        "--request-timeout",
        type=float,
        default=REPLY_TIMEOUT_S,
        help=f"seconds to wait for one reply (default {REPLY_TIMEOUT_S:.0f})",
    )
    p = parser.add_argument_group("progress")
    p.add_argument("--log-every", type=float, default=30.0, help="seconds between progress log lines off a terminal")
    add_config_argument(parser)


def config_from_args(args: argparse.Namespace) -> RegenConfig:
    missing = [
        flag
        for flag, value in (("--dataset", args.dataset), ("--output", args.regen_output), ("--server", args.server))
        if not value
    ]
    if missing:
        raise ConfigError(f"hsextract regenerate needs {', '.join(missing)} (as flags or keys of --config)")
    servers = args.server if isinstance(args.server, list) else [args.server]
    return RegenConfig(
        dataset=Path(args.dataset),
        output=Path(args.regen_output),
        servers=[str(s) for s in servers],
        model=Path(args.model) if args.model else None,
        reasoning=args.reasoning,
        last_turn_only=bool(args.last_turn_only),
        drop_truncated=bool(args.drop_truncated),
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_new_tokens=args.max_new_tokens,
        concurrency=int(args.concurrency),
        max_row_bytes=int(args.max_row_bytes),
        shard=Shard.parse(args.shard, where="--shard"),
        retry=RetryPolicy(
            max_attempts=int(args.max_attempts),
            server_wait_s=float(args.server_wait),
            read_timeout_s=float(args.request_timeout),
        ),
        log_every_s=float(args.log_every),
    )


def run(args: argparse.Namespace) -> int:
    run_ = RegenerateRun(config_from_args(args), shutdown.requested())
    try:
        stats = run_.run()
    except KeyboardInterrupt:
        run_.stop.set()
        raise
    print(progress_line(stats.snapshot()), file=sys.stderr)
    print(json.dumps(run_.summary(), sort_keys=True))
    return 0
