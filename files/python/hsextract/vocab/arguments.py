"""The draft-vocabulary flags, one definition for every command that writes the draft vocabulary.

``hsextract drain``, ``hsextract finalize`` and ``hsextract collect`` each write the trainers'
d2t/t2d files, so each takes the same ``--draft-vocab-size``, ``--vocab-size`` and
``--no-draft-vocab``, read the same way.
"""

from __future__ import annotations

import argparse

from hsextract.errors import ConfigError


def add_draft_vocab_arguments(parser: argparse.ArgumentParser) -> None:
    """The draft-vocabulary flags shared by `drain`, `finalize` and `collect`."""
    from hsextract.vocab.mapping import DEFAULT_DRAFT_VOCAB_SIZE

    g = parser.add_argument_group("draft vocabulary")
    g.add_argument(
        "--draft-vocab-size",
        type=int,
        nargs="+",
        default=[DEFAULT_DRAFT_VOCAB_SIZE],
        metavar="N",
        help=f"draft vocabulary sizes to write mappings for (default {DEFAULT_DRAFT_VOCAB_SIZE}; a size "
        "of at least the model's vocabulary is clamped to it)",
    )
    g.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="the model's vocabulary size (default: from --model's config.json or the manifest)",
    )
    g.add_argument(
        "--no-draft-vocab", action="store_true", help="do not count token frequencies nor write draft vocabulary files"
    )


def draft_vocab_settings(args: argparse.Namespace) -> tuple[tuple[int, ...], int | None]:
    """(sizes, vocabulary size or None) from the flags; ConfigError on a size below 1."""
    given = args.draft_vocab_size
    sizes = tuple(int(n) for n in ([given] if isinstance(given, (int, str)) else given or []))
    bad = [n for n in sizes if n < 1]
    if not sizes or bad:
        raise ConfigError(f"--draft-vocab-size {' '.join(map(str, sizes))}: give one or more sizes of at least 1")
    if args.vocab_size is not None and args.vocab_size < 1:
        raise ConfigError(f"--vocab-size {args.vocab_size}: must be at least 1")
    return sizes, args.vocab_size
