"""How many bytes a dataset index takes in a ``torch.save`` file: the one thing about a sample's
index that its file's size depends on (modelopt stores the index). Free of torch, so that ``plan``
can tally sample shapes without importing it."""

from __future__ import annotations


def pickled_int_bytes(n: int) -> int:
    """Bytes pickle protocol 2 (torch.save's) spends on the int `n`: its opcode class."""
    if 0 <= n < 1 << 8:
        return 1
    if 0 <= n < 1 << 16:
        return 2
    if -(1 << 31) <= n < 1 << 31:
        return 4
    return 5 + (n.bit_length() + 8) // 8  # LONG1


def same_size_index(index: int) -> int:
    """The smallest dataset index that a format storing the index (modelopt) writes in as many bytes.

    Sample sizes then depend on (tokens, same_size_index(index)) only, which is what ``plan`` tallies.
    """
    width = pickled_int_bytes(index)
    if index < 0 or width <= 4:
        return {1: 0, 2: 1 << 8, 4: 1 << 16}.get(width, index)
    return 1 << (index.bit_length() - 1)
