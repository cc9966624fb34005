"""FP8 rows: a sample's hidden states as float8_e4m3fn with one float32 scale per token.

The layout and the arithmetic are those of the released reader, hs_connectors 0.9.0
(``hs_connectors.fp8_utils``, read by ``hs_connectors.transfer.FP8Transfer``, speculators'
``--hidden-states-backend fp8``): for rows ``[T, K + 1, H]``, token t's scale is the largest
magnitude of its K + 1 rows divided by e4m3's largest value (448), at least 1e-12; the stored
values are the rows divided by their token's scale (in float32), cast to float8_e4m3fn. The reader
dequantizes with ``fp8.to(bf16) * scale.to(bf16)``, a product in bf16.

`quantize` is a pure function of a tensor: no file, no staging, no device of its own. It runs in
the drain today, on the staged bf16 rows of the CPU (hsextract.drain.prepare); the capture is to
call it on the GPU before the copy to the host, which would halve the bytes through /dev/shm as
well (a later step: /dev/shm stays bf16 while the drain quantizes). The amax is exact and the
division and the cast are correctly rounded float32 operations, so the GPU should give the CPU's
FP8 values; that is expected, not yet measured on a GPU.
"""

from __future__ import annotations

import torch

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
    """The rows a trainer reads back: ``fp8.to(dtype) * scales.to(dtype)``, as FP8Transfer computes them."""
    return fp8.to(dtype) * scales.to(dtype)


def scales_problem(scales: torch.Tensor, tokens: int) -> str | None:
    """Why `scales` are not a sample's FP8 scales (shape ``[tokens, 1, 1]``, float32, finite, above 0),
    else None: what the drain checks of what it writes, and ``finalize --verify`` of what it reads."""
    if scales.dtype != torch.float32 or tuple(scales.shape) != (tokens, 1, 1):
        return f"scales are {scales.dtype} {list(scales.shape)}, expected float32 [{tokens}, 1, 1]"
    if scales.numel() and not bool(torch.isfinite(scales).all() and (scales > 0).all()):
        bad = int((~(torch.isfinite(scales) & (scales > 0))).reshape(-1).nonzero()[0, 0])
        return f"token {bad}'s scale is {float(scales.reshape(-1)[bad])!r}, not a finite number above 0"
    return None
