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

from hsextract.collect.config import CollectConfig
from hsextract.errors import ConfigError
from hsextract.objectstore.settings import add_store_arguments
from hsextract.options import add_options, missing_options, options_from
from hsextract.vocab.arguments import add_draft_vocab_arguments, draft_vocab_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, CollectConfig)
    add_draft_vocab_arguments(parser)
    add_store_arguments(parser)


def check_workers(workers: int) -> None:
    if workers < 1:
        raise ConfigError(f"--workers {workers}: give at least 1")


def config_from_args(args: argparse.Namespace) -> CollectConfig:
    """A collect into a directory: its settings from its flags."""
    if missing_options(CollectConfig, args):
        raise ConfigError("collect needs --into DIR, the collected set's directory")
    check_workers(args.workers)
    sizes, vocab_size = draft_vocab_settings(args)
    cfg: CollectConfig = options_from(
        CollectConfig, args, draft_vocab_sizes=None if args.no_draft_vocab else sizes, vocab_size=vocab_size
    )
    return cfg


def run_in_bucket(args: argparse.Namespace) -> int:
    """`--into s3://...`: every host an s3:// prefix on the same server, merged in place."""
    from hsextract.objectstore.collect import collect_in_place
    from hsextract.objectstore.output import resolve_output
    from hsextract.objectstore.retries import RetryLog, describe
    from hsextract.objectstore.store import ObjectStore
    from hsextract.objectstore.url import is_object_url, parse_object_url

    if args.link or args.move:
        raise ConfigError("--link and --move are for directories: a bucket's samples are copied by the server")
    if args.to_bf16:
        raise ConfigError(
            "--to-bf16 is for directories: a collect in a bucket copies each sample on the server, unread; "
            "pull the collected set with `hsextract pull --to-bf16` for bf16 files"
        )
    check_workers(args.workers)
    sizes, vocab_size = draft_vocab_settings(args)
    work, target = resolve_output(args.into, args)
    assert target is not None
    retries = RetryLog(target.settings.attempts)  # one count of every store's retries
    hosts = []
    for text in args.hosts:
        name, sep, url = text.partition("=")
        if not sep:
            name, url = "", text
        if not is_object_url(url):
            raise ConfigError(f"host {text!r}: with --into s3://..., give each host's s3://bucket/prefix")
        parsed = parse_object_url(url, "host")
        hosts.append((name or parsed.prefix.rsplit("/", 1)[-1], ObjectStore(parsed, target.settings, retries=retries)))
    if not hosts:
        raise ConfigError("collect needs at least one host output (NAME=s3://bucket/prefix)")
    names = [n for n, _ in hosts]
    if len(set(names)) != len(names):
        raise ConfigError(f"host names given twice: {', '.join(sorted(names))}: name each host once (NAME=URL)")
    work.mkdir(parents=True, exist_ok=True)
    result = collect_in_place(
        ObjectStore(target.url, target.settings, retries=retries),
        hosts,
        work,
        None if args.no_draft_vocab else sizes,
        vocab_size,
        workers=args.workers * 4,
    )
    print("\n".join([*result.lines, f"object store: {describe(retries.as_dict())}"]), file=sys.stderr)
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
