"""A sample's fingerprint: taken on the GPU inside the forward pass, checked by the writer and the drain.

Why: the capture copies a batch's rows to the host asynchronously, after the hook has returned.
A copy that reads memory SGLang has meanwhile written for the next batch (its input buffers are
static and reused batch after batch) stages another batch's data under this request's name, and
nothing downstream can tell by looking at the rows alone. So at hook time, on the forward pass's
own stream, the capture reduces each row it keeps to one 64-bit number; the writer recomputes
those numbers from its host copy before it marks a dump done, and the drain recomputes the
request's fingerprint from the staged file before it commits the sample. A copy that landed
anything else than what the forward pass computed is caught where it starts.

Definition (identical on every device, since integer addition modulo 2**64 does not depend on
the order of a reduction):

* a row's value is the wrapping sum of its bytes read as 64-bit words (narrower words where a
  row's size is not a multiple of 8 bytes), plus its token id times an odd constant;
* a request's fingerprint is the wrapping sum over its rows ``r`` (positions in the prompt) of
  ``value[r] * (2 r + 1)``. The odd weights make a moved row change it, and a request staged in
  chunks adds its chunks' partial sums.

This is a check against data landing in the wrong place, not a cryptographic hash.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_ID_MULT = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed 64-bit integer (odd)
_MASK = (1 << 64) - 1


def word_bytes(row_bytes: int) -> int:
    """The width of the words a row of ``row_bytes`` is summed in (8, 4, 2 or 1)."""
    for width in (8, 4, 2):
        if row_bytes % width == 0:
            return width
    return 1


_TORCH_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
_NUMPY_WORDS = {8: np.int64, 4: np.int32, 2: np.int16, 1: np.uint8}


def row_values(block: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """int64 ``[rows]``: each row's value, on the device of ``block`` (a contiguous ``[rows, ...]``
    tensor) and ``ids`` (int64 ``[rows]``). Runs inside the forward pass: one reduction kernel."""
    rows = block.shape[0]
    flat = block.reshape(rows, -1)
    width = word_bytes(flat.shape[1] * flat.element_size())
    words = flat.view(_TORCH_WORDS[width])
    sums = words.sum(dim=1) if width == 8 else words.sum(dim=1, dtype=torch.int64)
    return sums + ids.to(torch.int64) * _ID_MULT


def row_values_np(rows: np.ndarray | memoryview | bytes, ids: np.ndarray, row_bytes: int) -> np.ndarray:
    """`row_values` from host bytes: ``rows`` holds ``len(ids)`` rows of ``row_bytes`` each."""
    n = len(ids)
    raw = np.frombuffer(rows, dtype=np.uint8, count=n * row_bytes)
    width = word_bytes(row_bytes)
    words = raw.view(_NUMPY_WORDS[width]).reshape(n, row_bytes // width)
    sums = words.sum(axis=1) if width == 8 else words.sum(axis=1, dtype=np.int64)
    return sums + np.asarray(ids, dtype=np.int64) * np.int64(_ID_MULT)


def combine(values: np.ndarray | Sequence[int], first_row: int) -> int:
    """The partial fingerprint of rows ``first_row ..`` of a request, from their values (an int in
    [0, 2**64)); partial sums of a request's chunks add modulo 2**64."""
    v = np.asarray(values, dtype=np.int64).view(np.uint64)
    weights = (2 * np.arange(first_row, first_row + len(v), dtype=np.uint64) + np.uint64(1))
    with np.errstate(over="ignore"):
        return int(np.sum(v * weights, dtype=np.uint64))


def add(a: int, b: int) -> int:
    """Two partial fingerprints of one request, added."""
    return (a + b) & _MASK


def to_hex(value: int) -> str:
    """How a fingerprint is written in ``done.json`` and the manifest."""
    return f"{value & _MASK:016x}"


def of_states(hidden: torch.Tensor, input_ids: torch.Tensor) -> str:
    """The fingerprint of a whole staged request (its ``[P, K + 1, H]`` rows and ids), as hex."""
    rows = hidden.shape[0]
    if rows == 0:
        return to_hex(0)
    flat = hidden.contiguous().reshape(rows, -1)
    row_bytes = flat.shape[1] * flat.element_size()
    raw = flat.view(torch.uint8).numpy()
    return to_hex(combine(row_values_np(raw, input_ids.numpy(), row_bytes), 0))
