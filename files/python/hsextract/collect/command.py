"""``hsextract collect``: bring the training sets of many hosts into one, verified.

Each host output is a directory ``hsextract drain`` wrote: on a shared mount, or pulled by
rsync into a local staging directory per host (``playbooks/collect.yml`` does that). The
collected set is an output directory like a drain's, in the same format, that every trainer
reads as it reads one host's; see hsextract.collect for what is checked and guaranteed.

People read the report on stderr; the last line on stdout is one JSON object for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hsextract.collect.config import DEFAULT_WORKERS, CollectConfig
from hsextract.collect.hosts import parse_host_argument
from hsextract.errors import ConfigError
from hsextract.objectstore.settings import add_store_arguments
from hsextract.vocab.arguments import add_draft_vocab_arguments, draft_vocab_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "hosts",
        nargs="*",
        metavar="[NAME=]HOST_OUTPUT",
        help="each host's output directory (the drain's --output, or rsync's copy of it); NAME "
        "defaults to the directory's name. After --draft-vocab-size, put them after --",
    )
    parser.add_argument(
        "--into",
        help="the collected set's directory (created; collecting again adds what is new), "
        "or s3://bucket/prefix: the hosts' s3:// prefixes merged in place, by "
        "server-side copies (docs/object-store.md)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--link",
        action="store_true",
        help="hard-link the hosts' sample files instead of copying them (no space used; the host "
        "outputs must be on the collected set's filesystem, else it is refused)",
    )
    mode.add_argument(
        "--move",
        action="store_true",
        help="move the hosts' sample files (a hard link on one filesystem, else a copy; each host "
        "file is removed once its sample is committed); refused for a host a drain runs on",
    )
    parser.add_argument(
        "--final",
        action="store_true",
        help="the last collect of the run: refuse a host whose client has not finished or whose "
        "drain has not caught up with it, and fail (exit 3) unless the shards cover the "
        "dataset exactly once and every sample is accounted for",
    )
    parser.add_argument(
        "--wait-for-space",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="when the collected set's volume is full, say so and retry every SECONDS "
        "(default 0: stop with the numbers, exit 5; run it again once there is room)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        help="samples fetched and verified at once (default: one per core, at most 4)",
    )
    parser.add_argument(
        "--stale-after",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="a host drain's status older than this no longer counts as a drain at work (default 60)",
    )
    add_draft_vocab_arguments(parser)
    add_store_arguments(parser)


def config_from_args(args: argparse.Namespace) -> CollectConfig:
    if not args.into:
        raise ConfigError("collect needs --into DIR, the collected set's directory")
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: give at least 1")
    sizes, vocab_size = draft_vocab_settings(args)
    return CollectConfig(
        into=Path(args.into),
        hosts=[parse_host_argument(h) for h in args.hosts],
        mode="link" if args.link else "move" if args.move else "copy",
        final=bool(args.final),
        wait_for_space_s=max(0.0, float(args.wait_for_space)),
        workers=int(args.workers),
        draft_vocab_sizes=None if args.no_draft_vocab else sizes,
        vocab_size=vocab_size,
        stale_after_s=float(args.stale_after),
    )


def run_in_bucket(args: argparse.Namespace) -> int:
    """`--into s3://...`: every host an s3:// prefix on the same server, merged in place."""
    from hsextract.objectstore.collect import collect_in_place
    from hsextract.objectstore.output import resolve_output
    from hsextract.objectstore.store import ObjectStore
    from hsextract.objectstore.url import is_object_url, parse_object_url

    if args.link or args.move:
        raise ConfigError("--link and --move are for directories: a bucket's samples are copied by the server")
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: give at least 1")
    sizes, vocab_size = draft_vocab_settings(args)
    work, target = resolve_output(args.into, args)
    assert target is not None
    hosts = []
    for text in args.hosts:
        name, sep, url = text.partition("=")
        if not sep:
            name, url = "", text
        if not is_object_url(url):
            raise ConfigError(f"host {text!r}: with --into s3://..., give each host's s3://bucket/prefix")
        parsed = parse_object_url(url, "host")
        hosts.append((name or parsed.prefix.rsplit("/", 1)[-1], ObjectStore(parsed, target.settings)))
    if not hosts:
        raise ConfigError("collect needs at least one host output (NAME=s3://bucket/prefix)")
    names = [n for n, _ in hosts]
    if len(set(names)) != len(names):
        raise ConfigError(f"host names given twice: {', '.join(sorted(names))}: name each host once (NAME=URL)")
    work.mkdir(parents=True, exist_ok=True)
    result = collect_in_place(
        ObjectStore(target.url, target.settings),
        hosts,
        work,
        None if args.no_draft_vocab else sizes,
        vocab_size,
        workers=args.workers * 4,
    )
    print("\n".join(result.lines), file=sys.stderr)
    print(
        json.dumps(
            {
                "exit_code": result.exit_code,
                "collected_now": result.collected_now,
                "failed": result.failed,
                "samples": result.total,
                "into": str(target.url),
            },
            sort_keys=True,
        )
    )
    return result.exit_code


def run(args: argparse.Namespace) -> int:
    from hsextract.collect.runner import collect
    from hsextract.objectstore.url import is_object_url

    if is_object_url(args.into or ""):
        return run_in_bucket(args)

    result = collect(config_from_args(args))
    print("\n".join(result.lines), file=sys.stderr)
    print(
        json.dumps(
            {
                "exit_code": result.exit_code,
                "collected_now": result.collected_now,
                "samples": result.total,
                "report": str(Path(args.into) / ".hsextract" / "collect-report.json"),
            },
            sort_keys=True,
        )
    )
    return result.exit_code
