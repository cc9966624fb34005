"""FP8 rows: a sample's hidden states as float8_e4m3fn with one float32 scale per token.

The layout and the arithmetic are those of the released reader, hs_connectors 0.9.0
(``hs_connectors.fp8_utils``, read by ``hs_connectors.transfer.FP8Transfer``, speculators'
``--hidden-states-backend fp8``): for rows ``[T, K + 1, H]``, token t's scale is the largest
magnitude of its K + 1 rows divided by e4m3's largest value (448), at least 1e-12; the stored
values are the rows divided by their token's scale (in float32), cast to float8_e4m3fn. The reader
dequantizes with ``fp8.to(bf16) * scale.to(bf16)``, a product in bf16.

`quantize` is a pure function of a tensor: no file, no staging, no device of its own. It runs in
one of two places. In the drain (hsextract.drain.fp8_rows), on the staged bf16 rows, on the CPU.
Or, with the capture's ``precision: fp8``, in the capture (hsextract.capture.host_stage.own_batch),
on the server's device before the copy to the host: /dev/shm, the copy and the drain then carry
the FP8 rows and their scales, half the bytes, and the drain writes them as staged. On a CPU both
places give the same bytes. On a GPU they do not quite: torch computes a CUDA tensor divided by a
Python number as a product with its reciprocal (``div_true_kernel_cuda``, "may lose one bit of
precision"), so the scale ``amax / 448`` is one bit off the CPU's quotient for about half the tokens
(3,946 of 8,192 on an H100), and 0.016 % of the FP8 codes then round to the neighbouring step. Either
is a valid FP8 row (the reader multiplies by the stored scale); hs_connectors, which runs the same
expression, gives the GPU's bytes on a GPU (bench/gpu/fp8_capture_cost.py measures the differences).

A stored FP8 row's fingerprint (hsextract.fingerprint) is of its FP8 bytes followed by its scale's
four bytes (`stored_row_values`): the one definition of the capture, the drain and ``finalize
--verify``, so the capture's fingerprint of a request is the one its set records.
"""

from __future__ import annotations

import numpy as np
import torch

from hsextract import fingerprint

DTYPE = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(DTYPE).max)  # 448
SCALE_MIN = 1e-12
SCALES_KEY = "hidden_states_scales"  # the tensor name of the scales in a speculators FP8 file


def quantize(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8, scales) of `rows` (``[T, ...]`` of any float dtype, on any device): one float32 scale per
    token (dim 0), ``scales`` of shape ``[T, 1, ...]`` (as many dims as `rows`), ``fp8`` of the
    shape of `rows` in float8_e4m3fn. Bit for bit hs_connectors' ``quantize_tensor_to_fp8``."""
    fp32 = rows.float()
    dims = tuple(range(1, fp32.dim()))
    amax = fp32.abs().amax(dim=dims, keepdim=True) if dims else fp32.abs()
    scales = (amax / E4M3_MAX).clamp(min=SCALE_MIN)
    return (fp32 / scales).to(DTYPE), scales


def dequantize(fp8: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The rows a trainer reads back: ``fp8.to(dtype) * scales.to(dtype)``, as FP8Transfer computes them.
    On a CPU the cast is a lookup in the 256 values torch's own cast gives each code (the same values,
    bit for bit, in a fifth of the time: torch casts float8 to bf16 at about 0.1 G values/s a core)."""
    if fp8.device.type != "cpu" or dtype not in _INT_VIEW:
        return fp8.to(dtype) * scales.to(dtype)
    table = _cast_table(dtype)
    codes = fp8.contiguous().view(torch.uint8).numpy()
    values = torch.from_numpy(table[codes]).view(dtype)
    return values * scales.to(dtype)


_INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
_TABLES: dict[torch.dtype, np.ndarray] = {}


def _cast_table(dtype: torch.dtype) -> np.ndarray:
    """torch's cast of each of the 256 e4m3fn codes to `dtype`, as integers of its width (numpy has no bf16)."""
    if dtype not in _TABLES:
        cast = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(DTYPE).to(dtype)
        _TABLES[dtype] = cast.view(_INT_VIEW[dtype]).numpy().copy()
    return _TABLES[dtype]


def scales_problem(scales: torch.Tensor, tokens: int) -> str | None:
    """Why `scales` are not a sample's FP8 scales (shape ``[tokens, 1, 1]``, float32, finite, above 0),
    else None: what the drain checks of what it writes, and ``finalize --verify`` of what it reads."""
    if scales.dtype != torch.float32 or tuple(scales.shape) != (tokens, 1, 1):
        return f"scales are {scales.dtype} {list(scales.shape)}, expected float32 [{tokens}, 1, 1]"
    if scales.numel() and not bool(torch.isfinite(scales).all() and (scales > 0).all()):
        bad = int((~(torch.isfinite(scales) & (scales > 0))).reshape(-1).nonzero()[0, 0])
        return f"token {bad}'s scale is {float(scales.reshape(-1)[bad])!r}, not a finite number above 0"
    return None


def first_nan_row(raw: np.ndarray) -> int | None:
    """The first row of a uint8 ``[n, row bytes]`` array of e4m3fn codes that holds a NaN (its only NaN
    codes are 0x7F and 0xFF; it has no infinity), or None."""
    nan = ((raw & 0x7F) == 0x7F).any(axis=1)
    return int(np.argmax(nan)) if nan.any() else None


def unreadable(scales: torch.Tensor, tokens: int, nan_row: int | None) -> str | None:
    """Why FP8 rows with these `scales` and their first NaN row (`first_nan_row`, None: none) are not a
    sample a trainer can read, else None: the scales (`scales_problem`) first, then the NaN. What the
    drain checks of the FP8 rows it quantizes and of those a capture staged."""
    problem = scales_problem(scales, tokens)
    if problem is None and nan_row is not None:
        problem = f"token {nan_row}'s FP8 row holds a NaN"
    return problem


def stored_row_values_np(raw: np.ndarray, scales: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """int64 ``[n]``: each stored row's fingerprint value, of its FP8 bytes (uint8 ``[n, row bytes]``)
    followed by its float32 scale's bytes (``scales``: ``n`` float32, any shape)."""
    n = raw.shape[0]
    tail = np.ascontiguousarray(scales, dtype=np.float32).reshape(n, 1).view(np.uint8)
    row_bytes = raw.shape[1] + 4
    try:  # each part's own words: no copy of the rows
        return fingerprint.row_values_parts_np([np.ascontiguousarray(raw), tail], ids, row_bytes)
    except ValueError:  # a row width that splits the words: the rows copied whole
        return fingerprint.row_values_np(np.concatenate([raw, tail], axis=1), ids, row_bytes)


def stored_row_values(q: torch.Tensor, scales: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """`stored_row_values_np` of FP8 rows ``q`` ``[T, ...]`` and their ``T`` float32 scales, on their
    device (int64 ``[T]``): the capture's, inside the forward pass. On a GPU the stored rows are put
    together once (a temporary of the FP8 block's size plus 4 bytes a row)."""
    rows = q.shape[0]
    raw = q.reshape(rows, -1).view(torch.uint8)
    tail = scales.reshape(rows, 1).to(torch.float32).contiguous().view(torch.uint8)
    if q.device.type == "cpu":
        return torch.from_numpy(stored_row_values_np(raw.numpy(), tail.view(torch.float32).numpy(), ids.numpy()))
    return fingerprint.row_values(torch.cat([raw, tail], dim=1), ids)
