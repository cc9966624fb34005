"""``hsextract finalize``: (re)write an output directory's dataset-level files from its manifest.

The drain does this itself when idle and when it stops; this command is for a directory copied
elsewhere, or to check one: ``--verify`` re-reads every file and compares size and checksum.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hsextract.config_file import add_config_argument
from hsextract.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", help="training-set directory (the drain's --output)")
    parser.add_argument("--verify", action="store_true", help="check every sample's size and checksum")
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    from hsextract.formats import get_format
    from hsextract.formats.manifest import iter_entries, read_header, repair_torn_tail, verify_entry

    if not args.output:
        raise ConfigError("finalize needs --output (on the command line or in --config)")
    out = Path(args.output)
    header = read_header(out)
    if header is None:
        raise ConfigError(f"{out}: no manifest.json; nothing was drained into this directory yet")
    repair_torn_tail(out)
    entries = list(iter_entries(out))
    bad = 0
    if args.verify:
        for e in entries:
            problem = verify_entry(out, e)
            if problem:
                bad += 1
                print(f"BAD {e.output_index} ({e.rid}): {problem}")
        print(f"verified {len(entries) - bad}/{len(entries)} samples")
    paths = get_format(header.format).finalize(out, header, entries)
    print(f"{out}: {len(entries)} samples ({header.format}); wrote {', '.join(p.name for p in paths) or 'nothing'}")
    return 1 if bad else 0
