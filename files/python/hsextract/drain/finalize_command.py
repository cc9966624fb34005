"""``hsextract finalize``: (re)write an output directory's dataset-level files from its manifest.

The drain does this itself when idle and when it stops; this command is for a directory copied
elsewhere, or to check one: ``--verify`` re-reads every file and compares size and checksum, and
recounts the loss-masked tokens from the files against the draft vocabulary's counts.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from hsextract.config_file import add_config_argument
from hsextract.drain.command import add_draft_vocab_arguments, draft_vocab_settings
from hsextract.errors import ConfigError
from hsextract.output_lock import OutputLock


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", help="training-set directory (the drain's --output)")
    parser.add_argument("--verify", action="store_true",
                        help="check every sample's size and checksum, and the token counts against a recount")
    add_draft_vocab_arguments(parser)
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    if not args.output:
        raise ConfigError("finalize needs --output (on the command line or in --config)")
    sizes, vocab_size = draft_vocab_settings(args)
    out = Path(args.output)
    # A drain of this output rewrites what finalize writes and reads (hsextract.output_lock): refuse
    # while one runs, and keep one from starting meanwhile. Verifying alone needs no write access.
    with OutputLock(out, "finalize", read_only=not os.access(out, os.W_OK)):
        return _finalize(args, out, sizes, vocab_size)


def _finalize(args: argparse.Namespace, out: Path, sizes: tuple[int, ...], vocab_size: int | None) -> int:
    from hsextract.formats import get_format
    from hsextract.formats.manifest import iter_entries, read_header, repair_torn_tail, verify_entry

    header = read_header(out)
    if header is None:
        raise ConfigError(f"{out}: no manifest.json; nothing was drained into this directory yet")
    repair_torn_tail(out)
    entries = list(iter_entries(out))
    fmt = get_format(header.format)
    bad = 0
    if args.verify:
        for e in entries:
            problem = verify_entry(out, e)
            if problem:
                bad += 1
                print(f"BAD {e.output_index} ({e.rid}): {problem}")
        print(f"verified {len(entries) - bad}/{len(entries)} samples")
    paths = fmt.finalize(out, header, entries)
    if not args.no_draft_vocab:
        bad_counts, vocab_paths = _draft_vocab(out, fmt, entries, sizes, vocab_size or header.vocab_size, args.verify)
        bad += bad_counts
        paths += vocab_paths
    names = ", ".join(str(p.relative_to(out)) for p in paths) or "nothing"
    print(f"{out}: {len(entries)} samples ({header.format}); wrote {names}")
    return 1 if bad else 0


def _draft_vocab(out: Path, fmt, entries, sizes, vocab_size: int, verify: bool) -> tuple[int, list[Path]]:
    """Bring the token counts up to the manifest and write the trainers' files; with `verify`, first
    recount everything from the files and write nothing from counts that differ."""
    from hsextract.vocab.tracker import VocabTracker

    tracker = VocabTracker(out, fmt, sizes, checkpoint_interval_s=0.0)
    tracker.recover(entries)
    if verify:
        problems = tracker.verify(entries)
        for problem in problems:
            print(f"BAD {problem}")
        counts, _ = tracker.snapshot()
        print(f"draft vocabulary: {counts.total} loss-masked tokens of {counts.distinct} distinct ids "
              f"{'differ from' if problems else 'equal'} a recount of the {len(entries)} samples' files")
        if problems:
            return len(problems), []
    return 0, tracker.write_files(vocab_size)
