"""``hsextract draft-config``: write a set's EAGLE-3 draft config (and SpecForge run file) by hand.

The drain writes both with the other dataset-level files; this command is for a set whose drain
could not read the model directory, a collected set, or another draft vocabulary size.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hsextract.errors import ConfigError

DEFAULT_DRAFT_VOCAB = 32000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", required=True, help="the training set (the drain's --output)")
    parser.add_argument("--model", help="the target model directory (default: the one the manifest names)")
    parser.add_argument(
        "--draft-vocab-size",
        type=int,
        default=None,
        help="the drafter's vocabulary (default: the set's first draft vocabulary size, else "
        f"{DEFAULT_DRAFT_VOCAB}; clamped to the model's vocabulary)",
    )


def run(args: argparse.Namespace) -> int:
    from hsextract.draft_config import write_set_draft_files
    from hsextract.output.manifest import iter_entries, read_header
    from hsextract.vocab.mapping import resolve_sizes

    out = Path(args.output)
    header = read_header(out)
    if header is None:
        raise ConfigError(f"{out}: no manifest.json; nothing was drained into this directory yet")
    size = args.draft_vocab_size or _first_size(out) or DEFAULT_DRAFT_VOCAB
    if header.vocab_size:
        size = resolve_sizes([size], header.vocab_size)[0].size
    model = args.model or header.model_path
    written = write_set_draft_files(out, header, list(iter_entries(out)), model, size)
    names = ", ".join(p.name for p in written) or "nothing (the files were up to date)"
    print(f"{out}: draft vocabulary {size}; wrote {names}")
    return 0


def _first_size(out: Path) -> int | None:
    import json

    from hsextract.vocab.files import SUMMARY_FILE

    try:
        sizes = json.loads((out / SUMMARY_FILE).read_text()).get("sizes") or []
    except (OSError, ValueError):
        return None
    return int(sizes[0]["size"]) if sizes else None
