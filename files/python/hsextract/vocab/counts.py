"""Loss-masked token frequencies: per sample, and summed over a training set."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def masked_counts(input_ids, loss_mask) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, how often each occurs) among the tokens of one sample with loss_mask == 1.

    Accepts tensors, arrays or lists; ids come back unique and ascending. This runs in the
    drain's workers, so the committer only adds small arrays.
    """
    ids = np.asarray(input_ids, dtype=np.int64).reshape(-1)
    mask = np.asarray(loss_mask).reshape(-1)
    if ids.shape != mask.shape:
        raise ValueError(f"{ids.shape[0]} input ids but {mask.shape[0]} loss-mask values")
    picked = ids[mask == 1]
    if picked.size and int(picked.min()) < 0:
        raise ValueError(f"negative token id {int(picked.min())}")
    uniq, n = np.unique(picked, return_counts=True)
    return uniq, n.astype(np.int64)


class TokenCounts:
    """Counts by token id: a dense int64 array indexed by id, grown as larger ids appear."""

    def __init__(self, dense: np.ndarray | None = None):
        self._a = np.zeros(0, dtype=np.int64) if dense is None else np.asarray(dense, dtype=np.int64).copy()

    @classmethod
    def from_pairs(cls, ids: Iterable[int], counts: Iterable[int]) -> TokenCounts:
        tc = cls()
        tc.add(np.fromiter(ids, dtype=np.int64), np.fromiter(counts, dtype=np.int64))
        return tc

    @classmethod
    def from_dict(cls, freq: dict) -> TokenCounts:
        return cls.from_pairs((int(k) for k in freq), (int(v) for v in freq.values()))

    def add(self, ids: np.ndarray, counts: np.ndarray) -> None:
        """Add `counts[j]` occurrences of token `ids[j]` (ids unique, as `masked_counts` gives them)."""
        if ids.size == 0:
            return
        top = int(ids.max()) + 1
        if top > self._a.shape[0]:
            grown = np.zeros(max(top, 2 * self._a.shape[0]), dtype=np.int64)
            grown[: self._a.shape[0]] = self._a
            self._a = grown
        np.add.at(self._a, ids, counts)

    def merge(self, other: TokenCounts) -> None:
        ids = np.flatnonzero(other._a)
        self.add(ids, other._a[ids])

    def dense(self, length: int | None = None) -> np.ndarray:
        """The counts as an array of `length` (default: up to the largest counted id)."""
        n = self.max_id() + 1 if length is None else length
        out = np.zeros(n, dtype=np.int64)
        m = min(n, self._a.shape[0])
        out[:m] = self._a[:m]
        return out

    def max_id(self) -> int:
        """The largest counted token id, or -1."""
        nz = np.flatnonzero(self._a)
        return int(nz[-1]) if nz.size else -1

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, counts) of every counted token, ids ascending."""
        ids = np.flatnonzero(self._a)
        return ids, self._a[ids]

    def to_dict(self) -> dict[int, int]:
        ids, n = self.items()
        return dict(zip(ids.tolist(), n.tolist(), strict=True))

    @property
    def total(self) -> int:
        return int(self._a.sum())

    @property
    def distinct(self) -> int:
        return int(np.count_nonzero(self._a))

    def difference(self, other: TokenCounts, limit: int = 5) -> list[tuple[int, int, int]]:
        """Up to `limit` (id, self's count, other's count) where the two differ; empty when equal."""
        n = max(self._a.shape[0], other._a.shape[0])
        a, b = self.dense(n), other.dense(n)
        ids = np.flatnonzero(a != b)[:limit]
        return [(int(i), int(a[i]), int(b[i])) for i in ids]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TokenCounts) and not self.difference(other, limit=1)

    def __repr__(self) -> str:
        return f"TokenCounts({self.distinct} ids, {self.total} tokens)"
