"""FP8 rows (hsextract.fp8): one float32 scale per token, float8_e4m3fn values, dequantized as the
released reader does. That the bytes are hs_connectors' own, bit for bit, is proven with the reader
itself (tests/formats/test_fp8_readers.py); here, the arithmetic's properties."""

from __future__ import annotations

import pytest
import torch
from hsextract import fp8


def _rows(tokens: int = 40, slots: int = 4, hidden: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # tokens of very different magnitudes: a scale per token keeps each token's precision
    size = torch.logspace(-3, 3, tokens)[:, None, None]
    return (torch.randn(tokens, slots, hidden, generator=g) * size).bfloat16()


def test_each_token_gets_one_float32_scale_of_its_largest_value_over_448():
    rows = _rows()
    q, scales = fp8.quantize(rows)
    assert q.dtype == torch.float8_e4m3fn and q.shape == rows.shape
    assert scales.dtype == torch.float32 and scales.shape == (rows.shape[0], 1, 1)
    amax = rows.float().abs().amax(dim=(1, 2), keepdim=True)
    assert torch.equal(scales, amax / 448)
    assert torch.equal(q.float().abs().amax(dim=(1, 2)), torch.full((rows.shape[0],), 448.0))


def test_pieces_of_whole_tokens_quantize_as_the_whole_does():
    rows = _rows()
    q, scales = fp8.quantize(rows)
    for a, b in ((0, 1), (1, 17), (17, 40)):
        qa, sa = fp8.quantize(rows[a:b])
        assert torch.equal(qa.view(torch.uint8), q[a:b].view(torch.uint8)) and torch.equal(sa, scales[a:b])


def test_the_dequantized_rows_are_within_half_an_e4m3_step_of_their_tokens_largest_value():
    rows = _rows()
    q, scales = fp8.quantize(rows)
    back = fp8.dequantize(q, scales)
    assert back.dtype == torch.bfloat16
    assert torch.equal(back, q.to(torch.bfloat16) * scales.to(torch.bfloat16)), "FP8Transfer's own arithmetic"
    amax = rows.float().abs().amax(dim=(1, 2), keepdim=True)
    err = (back.float() - rows.float()).abs()
    # e4m3 rounds to 3 mantissa bits (2**-4 of the token's largest value at most); the scale and the
    # product in bf16 add 2**-9 each
    assert bool((err <= amax * (2**-4 + 2**-8)).all()), float((err / amax).max())
    assert float((err / amax).max()) > 2**-6, "the rounding is e4m3's, not bf16's"


def test_a_token_of_zeros_keeps_a_scale_above_zero_and_comes_back_as_zeros():
    rows = _rows()
    rows[5] = 0
    q, scales = fp8.quantize(rows)
    assert float(scales[5]) == pytest.approx(1e-12) and not q[5].float().any()
    assert not fp8.dequantize(q, scales)[5].float().any()
    assert fp8.scales_problem(scales, rows.shape[0]) is None


@pytest.mark.parametrize(
    ("scales", "says"),
    [
        (torch.ones(3, 1, 1, dtype=torch.float32), None),
        (torch.ones(3, 1, 1, dtype=torch.bfloat16), "expected float32 [3, 1, 1]"),
        (torch.ones(3, 1, dtype=torch.float32), "expected float32 [3, 1, 1]"),
        (torch.tensor([[[1.0]], [[float("nan")]], [[1.0]]]), "token 1's scale is nan"),
        (torch.tensor([[[1.0]], [[1.0]], [[0.0]]]), "token 2's scale is 0.0"),
        (torch.tensor([[[float("inf")]], [[1.0]], [[1.0]]]), "token 0's scale is inf"),
    ],
)
def test_scales_a_trainer_cannot_use_are_named(scales, says):
    problem = fp8.scales_problem(scales, 3)
    assert (problem is None) if says is None else (says in problem), problem


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_cpus_lookup_dequantizes_every_code_as_the_readers_own_expression(dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8.DTYPE)
    q = codes.repeat(40, 1).reshape(40, 2, 128)  # every code under each of 40 tokens' scales
    scales = fp8.quantize(_rows(tokens=40, slots=2, hidden=128))[1]
    got, want = fp8.dequantize(q, scales, dtype), q.to(dtype) * scales.to(dtype)
    width = torch.int16 if dtype != torch.float32 else torch.int32
    assert got.dtype == dtype and torch.equal(got.view(width), want.view(width)), "bit for bit, NaN codes too"
