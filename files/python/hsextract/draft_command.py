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
    out = Path(args.output)
    size, written = write_set_draft_files(out, Path(args.model) if args.model else None, args.draft_vocab_size)
    names = ", ".join(p.name for p in written) or "nothing (the files were up to date)"
    print(f"{out}: draft vocabulary {size}; wrote {names}")
    return 0


def write_set_draft_files(out: Path, model: Path | None = None, draft_vocab_size: int | None = None):
    """Write the set `out`'s draft config (and SpecForge run file) from its manifest and the model
    directory (`model`, else the one the manifest names); (the draft vocabulary size, the files written)."""
    from hsextract.draft_config import max_length_for, write_draft_files
    from hsextract.output.manifest import iter_entries, read_header
    from hsextract.vocab.mapping import resolve_sizes

    header = read_header(out)
    if header is None:
        raise ConfigError(f"{out}: no manifest.json; nothing was drained into this directory yet")
    size = draft_vocab_size or _first_size(out) or DEFAULT_DRAFT_VOCAB
    if header.vocab_size:
        size = resolve_sizes([size], header.vocab_size)[0].size
    model = model or Path(header.model_path)
    if not (model / "config.json").is_file():
        raise ConfigError(f"{model}: no config.json; give the target model's directory with --model")
    written = write_draft_files(
        out,
        model_dir=model,
        architecture=header.architecture,
        sglang_layers=header.sglang_layers_to_capture,
        draft_vocab_size=size,
        fmt=header.format,
        max_length=max_length_for(list(iter_entries(out))),
    )
    return size, written


def _first_size(out: Path) -> int | None:
    import json

    from hsextract.vocab.files import SUMMARY_FILE

    try:
        sizes = json.loads((out / SUMMARY_FILE).read_text()).get("sizes") or []
    except (OSError, ValueError):
        return None
    return int(sizes[0]["size"]) if sizes else None
