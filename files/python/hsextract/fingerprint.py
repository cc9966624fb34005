"""A sample's fingerprint: taken on the GPU inside the forward pass, checked by the writer and the drain.

Why: the capture copies a batch's rows to the host asynchronously, after the hook has returned.
A copy that reads memory SGLang has meanwhile written for the next batch (its input buffers are
static and reused batch after batch) stages another batch's data under this request's name, and
nothing downstream can tell by looking at the rows alone. So at hook time, on the forward pass's
own stream, the capture reduces each row it keeps to one 64-bit number; the writer recomputes
those numbers from its host copy before it marks a dump done, and the drain recomputes the
request's fingerprint from the bytes it writes before it commits the sample. A copy that landed
anything else than what the forward pass computed is caught where it starts.

Definition, version 2 (identical on every device: integer sums and products modulo 2**64 do not
depend on the order of a reduction):

* a row's value is the wrapping sum of its bytes read as 64-bit words (narrower words where a
  row's size is not a multiple of 8 bytes), word ``j`` times its own odd weight
  ``1 + 2 * GOLDEN * j``, plus the row's token id times an odd constant;
* a request's fingerprint is the wrapping sum over its rows ``r`` (positions in the prompt) of
  ``value[r] * (2 r + 1)``: a moved row changes it, and a request staged in chunks adds its
  chunks' partial sums, in any order.

The word weights make the row value see where each word lies: version 1 summed the words alone,
so two words of a row swapped (one aux layer's slice with another's), or +x in one word and -x in
another, left it unchanged. With odd, distinct weights any change of one word is seen, and a change
of two words of one row is missed only when it is a multiple of 2**(63 - log2 of their distance)
(at least 2**50 for rows of up to 8,192 words). This is a check against data landing in the wrong
place, not a cryptographic hash.

A fingerprint is written ``fp2:<16 hex digits>`` (`to_text`), so a marker or manifest line says
which definition made it; version 1 wrote the bare hex digits. A drain refuses a dump whose
fingerprint is of another version rather than check it against the wrong definition.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

VERSION = 2
_PREFIX = f"fp{VERSION}:"
_ID_MULT = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed 64-bit integer (odd)
_WORD_STEP = np.uint64((2 * 0x9E3779B97F4A7C15) & ((1 << 64) - 1))  # word j's weight is 1 + j * _WORD_STEP
_MASK = (1 << 64) - 1
# On a GPU, the weighted words of this many bytes at most are held at once (the product is a
# temporary as large as the rows it covers; the block itself can be hundreds of MB).
_DEVICE_PIECE = 64 << 20


def word_bytes(row_bytes: int) -> int:
    """The width of the words a row of ``row_bytes`` is summed in (8, 4, 2 or 1)."""
    for width in (8, 4, 2):
        if row_bytes % width == 0:
            return width
    return 1


_TORCH_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
_NUMPY_WORDS = {8: np.int64, 4: np.int32, 2: np.int16, 1: np.uint8}


@functools.lru_cache(maxsize=64)
def word_weights(words: int) -> np.ndarray:
    """int64 ``[words]``: each word's weight in its row's value (odd, distinct; see the module)."""
    with np.errstate(over="ignore"):
        return (np.arange(words, dtype=np.uint64) * _WORD_STEP + np.uint64(1)).view(np.int64)


@functools.lru_cache(maxsize=64)
def _device_weights(words: int, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(word_weights(words)).to(device)


def row_values(block: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """int64 ``[rows]``: each row's value, on the device of ``block`` (a contiguous ``[rows, ...]``
    tensor) and ``ids`` (int64 ``[rows]``). Runs inside the forward pass."""
    rows = block.shape[0]
    flat = block.reshape(rows, -1)
    row_bytes = flat.shape[1] * flat.element_size()
    if flat.device.type == "cpu":  # numpy's integer dot product: one pass, no temporary
        return torch.from_numpy(row_values_np(flat.view(torch.uint8).numpy(), ids.numpy(), row_bytes))
    return weighted_word_sums(flat.view(_TORCH_WORDS[word_bytes(row_bytes)])) + ids.to(torch.int64) * _ID_MULT


def weighted_word_sums(words: torch.Tensor) -> torch.Tensor:
    """int64 ``[rows]``: each row of ``words`` (``[rows, n]``, any integer dtype) summed with the word
    weights, on its device: a multiply and a reduction per piece of at most `_DEVICE_PIECE` bytes of
    products (one piece for most batches), since a device has no integer matrix-vector product."""
    rows, n = words.shape
    if rows == 0:
        return torch.zeros(0, dtype=torch.int64, device=words.device)
    weights = _device_weights(n, words.device)
    step = max(1, _DEVICE_PIECE // max(1, 8 * n))
    return torch.cat([(words[a : a + step] * weights).sum(dim=1) for a in range(0, rows, step)])


def row_values_np(rows: np.ndarray | memoryview | bytes, ids: np.ndarray, row_bytes: int) -> np.ndarray:
    """`row_values` from host bytes: ``rows`` holds ``len(ids)`` rows of ``row_bytes`` each."""
    n = len(ids)
    raw = np.frombuffer(rows, dtype=np.uint8, count=n * row_bytes)
    width = word_bytes(row_bytes)
    words = raw.view(_NUMPY_WORDS[width]).reshape(n, row_bytes // width)
    if width != 8:
        words = words.astype(np.int64)
    sums = words @ word_weights(words.shape[1])  # wraps modulo 2**64, like every integer op here
    return sums + np.asarray(ids, dtype=np.int64) * np.int64(_ID_MULT)


def row_values_parts_np(parts: Sequence[np.ndarray], ids: np.ndarray, row_bytes: int) -> np.ndarray:
    """`row_values_np` of rows whose bytes are spread over column blocks: ``parts[i]`` is a C-contiguous
    uint8 ``[len(ids), w_i]`` array, each row's bytes in order across the parts (a format's slot
    groups, read straight into their own arrays). A row's value is its words' weighted sum, so each
    part adds its own words with their weights; every width must be a multiple of the row's word
    width (ValueError otherwise: the caller then checks whole rows)."""
    width = word_bytes(row_bytes)
    weights = word_weights(row_bytes // width)
    sums = np.zeros(len(ids), dtype=np.int64)
    col = 0
    for part in parts:
        w = part.shape[1]
        if w % width:
            raise ValueError(f"a part of {w} bytes splits the rows' {width}-byte words")
        if w:
            words = part.view(_NUMPY_WORDS[width])
            if width != 8:
                words = words.astype(np.int64)
            sums += words @ weights[col // width : (col + w) // width]  # wraps modulo 2**64
        col += w
    if col != row_bytes:
        raise ValueError(f"parts of {col} bytes for rows of {row_bytes}")
    return sums + np.asarray(ids, dtype=np.int64) * np.int64(_ID_MULT)


def combine(values: np.ndarray | Sequence[int], first_row: int) -> int:
    """The partial fingerprint of rows ``first_row ..`` of a request, from their values (an int in
    [0, 2**64)); partial sums of a request's chunks add modulo 2**64."""
    v = np.asarray(values, dtype=np.int64).view(np.uint64)
    weights = 2 * np.arange(first_row, first_row + len(v), dtype=np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        return int(np.sum(v * weights, dtype=np.uint64))


def add(a: int, b: int) -> int:
    """Two partial fingerprints of one request, added."""
    return (a + b) & _MASK


def to_text(value: int) -> str:
    """How a fingerprint is written in ``done.json`` and the manifest: its version, then 16 hex digits."""
    return f"{_PREFIX}{value & _MASK:016x}"


def version_of(text: str) -> int | None:
    """The definition's version a written fingerprint names (1: bare hex digits); None if it names none."""
    head, sep, digits = text.rpartition(":")
    if not sep:
        head, digits = "fp1", text
    if len(digits) != 16 or not head.startswith("fp") or not head[2:].isdigit():
        return None
    try:
        int(digits, 16)
    except ValueError:
        return None
    return int(head[2:])


def of_rows(raw: np.ndarray | memoryview | bytes, ids: np.ndarray, row_bytes: int) -> str:
    """The fingerprint of a whole request from its rows' bytes (``len(ids)`` rows of ``row_bytes``), as text."""
    if len(ids) == 0:
        return to_text(0)
    return to_text(combine(row_values_np(raw, ids, row_bytes), 0))


def of_states(hidden: torch.Tensor, input_ids: torch.Tensor) -> str:
    """The fingerprint of a whole staged request (its ``[P, K + 1, H]`` rows and ids), as text."""
    rows = hidden.shape[0]
    if rows == 0:
        return to_text(0)
    flat = hidden.contiguous().reshape(rows, -1)
    return of_rows(flat.view(torch.uint8).numpy(), input_ids.numpy(), flat.shape[1] * flat.element_size())
