"""Tokenize only as much of a text as a length limit needs.

A sample longer than the client's ``max_tokens`` is cut (or skipped), so only its first
``max_tokens + 1`` tokens matter. Tokenizing a whole row first costs memory in proportion to the
row: the tokenizer keeps offsets, words and strings per token (about 230 bytes per token in the
``tokenizers`` library, and the Python lists of ids and offsets as much again), so a row just under
the 8 MiB row limit took about 3 GB in ``plan`` and in the client, in every tokenizing process.

So a long text is tokenized in growing prefixes: a prefix of ``HEAD_CHARS_PER_TOKEN`` characters
per wanted token (at least ``MIN_HEAD_CHARS``), doubled until its tokens reach the limit. A prefix
can split the text mid-word, and a tokenizer's last tokens then differ from the whole text's; its
pre-tokenizer and BPE merges work word by word, so tokens that end well before the cut do not. The
head is taken only when the first ``limit + 1`` tokens all end ``MARGIN_CHARS`` before the cut and
a second prefix, ``MARGIN_CHARS`` longer, gives the same ones (ids and offsets); otherwise the prefix
grows, up to the whole text, which is then tokenized whole as before. A text shorter than the
first prefix is tokenized whole at once (every ordinary sample), so nothing changes for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HEAD_CHARS_PER_TOKEN = 16  # generous: English text averages about 4 characters a token
MIN_HEAD_CHARS = 64 << 10
MARGIN_CHARS = 4096  # no word the pre-tokenizer makes near the cut reaches back further in practice


@dataclass(frozen=True)
class Tokens:
    """Token ids and the character offset where each starts; `more` when the text holds tokens past
    these (it was tokenized only as far as the limit needed, so their number is not known)."""

    ids: list[int]
    starts: list[int]
    more: bool = False


def tokenize_head(tok: Any, text: str, limit: int | None) -> Tokens:
    """The tokens of `text` (no special tokens added), or, where it has more than `limit`, its first
    ``limit + 1`` tokens with ``more`` set."""
    if limit is not None:
        cut = max(MIN_HEAD_CHARS, (limit + 1) * HEAD_CHARS_PER_TOKEN)
        while cut + MARGIN_CHARS < len(text):
            head = _head(tok, text, cut, limit + 1)
            if head is not None:
                return head
            cut *= 2
    enc = _encode(tok, text)
    return Tokens(list(enc["input_ids"]), [s for s, _ in enc["offset_mapping"]])


def _head(tok: Any, text: str, cut: int, want: int) -> Tokens | None:
    """The first `want` tokens of `text`, if a prefix of `cut` characters surely has them."""
    first = _encode(tok, text[:cut])
    ids, offsets = first["input_ids"][:want], [tuple(o) for o in first["offset_mapping"][:want]]
    if len(ids) < want or offsets[-1][1] > cut - MARGIN_CHARS:
        return None
    second = _encode(tok, text[: cut + MARGIN_CHARS])
    if list(second["input_ids"][:want]) != list(ids) or [tuple(o) for o in second["offset_mapping"][:want]] != offsets:
        return None
    return Tokens(list(ids), [s for s, _ in offsets], more=True)


def _encode(tok: Any, text: str) -> Any:
    """The tokenizer's encoding of `text`: ``input_ids`` and ``offset_mapping``, no special tokens added."""
    return tok(text, add_special_tokens=False, return_offsets_mapping=True)
