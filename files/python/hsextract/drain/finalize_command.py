"""``hsextract finalize``: (re)write an output directory's dataset-level files from its manifest.

The drain does this itself when idle and when it stops; this command is for a directory copied
elsewhere, or to check one: ``--verify`` re-reads every file and checks that it is its row's sample
(its name, size and checksum, the token count of its tensors, its fingerprint:
hsextract.formats.sample_check; and that no other row's file has its bytes:
hsextract.output.same_bytes), and recounts the loss-masked tokens from the files against the
draft vocabulary's counts. A check
writes nothing, so it runs on a finished set on a read-only volume, on a copy a trainer is
reading, or beside a drain; ``finalize`` without it writes what the check would only report.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from hsextract.config_file import add_config_argument
from hsextract.errors import ConfigError
from hsextract.objectstore.settings import add_store_arguments
from hsextract.objectstore.url import is_object_url
from hsextract.output.finalized import record_finalized
from hsextract.output.lock import OutputLock
from hsextract.vocab.arguments import add_draft_vocab_arguments, draft_vocab_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", help="training-set directory (the drain's --output), or s3://bucket/prefix")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="check that every sample's file is its row's (name, size, checksum, token count, "
        "fingerprint), and the draft vocabulary's counts against a recount",
    )
    add_draft_vocab_arguments(parser)
    add_store_arguments(parser)
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    if not args.output:
        raise ConfigError("finalize needs --output (on the command line or in --config)")
    sizes, vocab_size = draft_vocab_settings(args)
    if is_object_url(args.output):
        return _finalize_bucket(args, sizes, vocab_size)
    out = Path(args.output)
    # A drain of this output rewrites what finalize writes and reads (hsextract.output.lock): refuse
    # while one runs, and keep one from starting meanwhile. Verifying alone needs no write access.
    with OutputLock(out, "finalize", read_only=not os.access(out, os.W_OK)):
        return _finalize(args, out, sizes, vocab_size)


def _finalize(args: argparse.Namespace, out: Path, sizes: tuple[int, ...], vocab_size: int | None) -> int:
    from hsextract.formats import get_format
    from hsextract.output.manifest import iter_entries, read_header
    from hsextract.output.repair import repair_torn_tail
    from hsextract.vocab.tracker import VocabTracker

    header = read_header(out)
    if header is None:
        raise ConfigError(f"{out}: no manifest.json; nothing was drained into this directory yet")
    fmt = get_format(header.format)
    if args.verify:
        return _verify(out, fmt, sizes, check_vocab=not args.no_draft_vocab)
    repair_torn_tail(out)
    entries = list(iter_entries(out))
    paths = fmt.finalize(out, header, entries)
    if not args.no_draft_vocab:
        tracker = VocabTracker(out, fmt, sizes, checkpoint_interval_s=0.0)
        tracker.recover(entries)  # the counts brought up to the manifest
        paths += tracker.write_files(vocab_size or header.vocab_size)
    record_finalized(out, len(entries))
    names = ", ".join(str(p.relative_to(out)) for p in paths) or "nothing"
    print(f"{out}: {len(entries)} samples ({header.format}); wrote {names}")
    return 0


def _verify(out: Path, fmt, sizes, check_vocab: bool) -> int:
    """Check every sample's file against its manifest row (hsextract.formats.sample_check: its name,
    size, checksum, shapes and fingerprint) and the draft vocabulary's counts against a recount of
    the files; print a BAD line per problem, write nothing; 1 if any was found."""
    from hsextract.formats.sample_check import SampleCheck
    from hsextract.output.manifest import entries_path, iter_entries, read_header
    from hsextract.output.same_bytes import describe, row_name, same_bytes

    torn = _torn_tail(entries_path(out))
    if torn:
        print(
            f"BAD {entries_path(out)} ends with a torn line ({torn} bytes, a crash mid-append; not a sample): "
            "`hsextract finalize` cuts it"
        )
    entries = list(iter_entries(out))
    header = read_header(out)
    assert header is not None  # _finalize refused a directory without one
    check = SampleCheck(fmt, header)
    twins = same_bytes(e for e in entries if e.file == fmt.relative_path(e.output_index))  # else BAD by its name
    bad_samples = 0
    for e in entries:
        problem = check.verify_row(out, e)
        if problem is None and id(e) in twins:
            problem = describe([row_name(o) for o in twins[id(e)]], e.checksum)
        if problem:
            bad_samples += 1
            print(f"BAD {e.output_index} ({e.rid}): {problem}")
    unchecked = sum(not check.checks_fingerprint(e) for e in entries)
    fp8 = header.precision == "fp8"  # its fingerprints are of the stored FP8 rows (hsextract.drain.fp8_rows)
    print(
        f"verified {len(entries) - bad_samples}/{len(entries)} samples (name, size, checksum, shapes"
        f"{', FP8 scales' if fp8 else ''}"
        f"{(', fingerprint of the stored FP8 rows' if fp8 else ', fingerprint') if unchecked < len(entries) else ''})"
        + (
            f"; {unchecked} carry no fingerprint this version computes: their rows were not recomputed"
            if unchecked
            else ""
        )
    )
    bad = bad_samples + bool(torn)
    if check_vocab and bad_samples:
        print(
            f"draft vocabulary: not checked, {bad_samples} sample file(s) are BAD: put them right (or their rows) "
            "and verify again"
        )
    elif check_vocab:
        bad += _verify_vocab(out, fmt, sizes, entries)
    print(f"{out}: checked, nothing written (`hsextract finalize --output {out}` writes the dataset-level files)")
    return 1 if bad else 0


def _verify_vocab(out: Path, fmt, sizes, entries) -> int:
    """Print the draft vocabulary's problems against a recount of the files; return how many."""
    from hsextract.vocab.tracker import VocabTracker, print_recount_verdict

    return print_recount_verdict(VocabTracker(out, fmt, sizes, checkpoint_interval_s=0.0), entries, "files")


def _finalize_bucket(args: argparse.Namespace, sizes: tuple[int, ...], vocab_size: int | None) -> int:
    """A set in a bucket: checked from its objects (`--verify`, anywhere the bucket is reachable),
    or its dataset-level files rewritten in its work directory and published."""
    from hsextract.objectstore.output import recorded_target, resolve_output
    from hsextract.objectstore.store import ObjectStore
    from hsextract.objectstore.verify import finalize_bucket, verify_bucket

    work, target = resolve_output(args.output, args)
    assert target is not None
    recorded = recorded_target(work)
    if (
        recorded is not None
        and recorded.url == target.url
        and not any((args.s3_endpoint, args.s3_region, args.s3_credentials))
    ):
        target = recorded  # how the drain reached it (the endpoint and the credentials file's path)
    store = ObjectStore(target.url, target.settings)
    if args.verify:
        return verify_bucket(store, sizes, check_vocab=not args.no_draft_vocab)
    with OutputLock(work, "finalize"):
        sent = finalize_bucket(store, work, sizes, vocab_size, count_vocab=not args.no_draft_vocab)
    print(f"{target.url}: published {', '.join(sent) or 'nothing new'}")
    return 0


def _torn_tail(path: Path) -> int:
    """Bytes after the manifest's last newline: a line torn by a crash mid-append."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    return len(data) - (data.rfind(b"\n") + 1)
