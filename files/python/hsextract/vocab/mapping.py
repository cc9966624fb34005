"""Which N tokens make the draft vocabulary, and how each trainer encodes the choice.

Every trainer takes the N most frequent loss-masked tokens; they differ in tie-breaking, padding
and layout. One selection serves them all: count descending, then id ascending (speculators'
``build_vocab_mappings_from_distribution``; SpecForge's ``Counter.most_common`` breaks ties by
first appearance, which is id order for counts gathered in id order), padded with the lowest
ids never counted when fewer than N tokens occur (both SpecForge and speculators pad that way).

* SpecForge / speculators: the selected ids sorted ascending; ``d2t[i] = id_i - i`` (int64 [N])
  and ``t2d[v] = v is selected`` (bool [V]).
* ModelOpt: ``d2t[i] = id_i - i`` with the ids in frequency order (``calibrate_frequent_vocab``
  takes ``Counter.most_common``), no t2d.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hsextract.errors import HsextractError
from hsextract.vocab.counts import TokenCounts

DEFAULT_DRAFT_VOCAB_SIZE = 32000


class VocabError(HsextractError):
    """The draft vocabulary cannot be built as configured (bad size, ids outside the vocabulary)."""


@dataclass(frozen=True)
class DraftSize:
    """One draft vocabulary size: as asked for, and as used (clamped to the model's vocabulary)."""

    requested: int
    size: int

    @property
    def clamped(self) -> bool:
        return self.size != self.requested


def resolve_sizes(requested: Sequence[int], vocab_size: int) -> list[DraftSize]:
    """The sizes to write, in the order given, without repeats; a size >= V is clamped to V.

    A draft vocabulary of the whole vocabulary maps every token to itself: the trainers skip the
    mapping then, and the files say so by being the identity. A size below 1 is an error.
    """
    if vocab_size < 1:
        raise VocabError("the model's vocabulary size is unknown; pass --model or --vocab-size")
    out: list[DraftSize] = []
    for n in requested:
        if int(n) < 1:
            raise VocabError(
                f"draft vocabulary size {n}: must be at least 1 (the default is {DEFAULT_DRAFT_VOCAB_SIZE})"
            )
        d = DraftSize(int(n), min(int(n), vocab_size))
        if d.size not in [o.size for o in out]:
            out.append(d)
    return out


def clamp_message(d: DraftSize, vocab_size: int) -> str:
    return (
        f"draft vocabulary size {d.requested} >= the model's vocabulary ({vocab_size} tokens): clamped to "
        f"{d.size}, the whole vocabulary (an identity mapping, which the trainers skip); give a smaller size "
        f"with --draft-vocab-size to get a reduced vocabulary"
    )


def check_ids(counts: TokenCounts, vocab_size: int) -> None:
    top = counts.max_id()
    if top >= vocab_size:
        raise VocabError(
            f"token id {top} is trained on in the training set but lies outside the model's vocabulary "
            f"({vocab_size} tokens, from the model's config.json or --vocab-size); the tokenizer and the model disagree"
        )


def select_tokens(counts: TokenCounts, n: int) -> np.ndarray:
    """The draft vocabulary's N token ids in frequency order (count descending, id ascending),
    then the padding (lowest uncounted ids, ascending) when fewer than N tokens were counted."""
    ids, freq = counts.items()
    order = np.lexsort((ids, -freq))
    top = ids[order][:n]
    if top.size < n:
        taken = np.zeros(n, dtype=bool)
        taken[top[top < n]] = True
        pad = np.flatnonzero(~taken)[: n - top.size]
        top = np.concatenate([top, pad])
    return top.astype(np.int64)


def sorted_mapping(selected: np.ndarray, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """SpecForge's and speculators' (d2t int64 [N], t2d bool [V]) for the selected ids."""
    ids = np.sort(selected)
    d2t = ids - np.arange(ids.size, dtype=np.int64)
    t2d = np.zeros(vocab_size, dtype=bool)
    t2d[ids] = True
    return d2t, t2d


def frequency_d2t(selected: np.ndarray) -> np.ndarray:
    """ModelOpt's d2t int64 [N]: offsets of the selected ids, kept in frequency order."""
    return selected - np.arange(selected.size, dtype=np.int64)


def coverage(counts: TokenCounts, selected: np.ndarray) -> float:
    """The share of trained-on tokens that the selected ids cover (1.0 when nothing was counted)."""
    total = counts.total
    if total == 0:
        return 1.0
    dense = counts.dense(max(counts.max_id(), int(selected.max(initial=-1))) + 1)
    return float(dense[selected].sum()) / total
