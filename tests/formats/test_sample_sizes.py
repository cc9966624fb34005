"""Every format knows the exact size of the file it writes for a sample, without writing it.

``hsextract plan`` sizes a training set from token counts alone; the numbers must be the bytes the
drain will write. The sizes are checked here against the format's own encoder for many shapes,
including hidden sizes that the sizing shrinks to a probe width (Kimi-K2.5's 7168).
"""

from __future__ import annotations

import pytest
import torch
from hsextract import fp8
from hsextract.formats import FORMAT_NAMES, get_format
from hsextract.formats.base import Sample, SampleShape, _CountingSink, _probe_hidden
from hsextract.formats.index_width import same_size_index
from hypothesis import given, settings
from hypothesis import strategies as st


def _encoded_bytes(fmt: str, s: SampleShape) -> int:
    sample = Sample(
        "hsx-0-0",
        s.dataset_index,
        torch.arange(s.tokens),
        torch.ones(s.tokens, dtype=torch.int64),
        torch.zeros(s.tokens, s.num_aux + 1, s.hidden_size, dtype=s.dtype),
        scales=torch.ones(s.tokens, 1, 1) if s.dtype == fp8.DTYPE else None,
    )
    sink = _CountingSink()
    get_format(fmt).encode(sample).write_to(sink)
    return sink.n


shapes = st.builds(
    SampleShape,
    tokens=st.integers(1, 600),
    num_aux=st.integers(1, 4),
    hidden_size=st.sampled_from([8, 64, 100, 256, 1000, 4096, 7168]),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    dataset_index=st.sampled_from([0, 7, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**40]),
).filter(lambda s: s.tokens * (s.num_aux + 1) * s.hidden_size <= 3_000_000)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@settings(max_examples=40, deadline=None)
@given(shape=shapes)
def test_the_sized_file_is_the_encoded_file(fmt, shape):
    assert get_format(fmt).sample_file_bytes(shape) == _encoded_bytes(fmt, shape)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("tokens", [1, 63, 64, 255, 256, 257, 1000])
def test_sizes_at_kimi_width_are_exact(fmt, tokens):
    shape = SampleShape(tokens, 3, 7168, torch.bfloat16, tokens * 1000)
    assert get_format(fmt).sample_file_bytes(shape) == _encoded_bytes(fmt, shape)


@settings(max_examples=40, deadline=None)
@given(shape=shapes)
def test_an_fp8_file_is_sized_exactly_at_one_byte_an_element_and_four_a_token_beside_the_header(shape):
    """What the plan counts for a set of FP8 rows (the speculators format's, hsextract.fp8)."""
    fp8_shape = SampleShape(shape.tokens, shape.num_aux, shape.hidden_size, fp8.DTYPE, shape.dataset_index)
    sized = get_format("speculators").sample_file_bytes(fp8_shape)
    assert sized == _encoded_bytes("speculators", fp8_shape)
    t, elements = shape.tokens, shape.tokens * (shape.num_aux + 1) * shape.hidden_size
    assert 0 < sized - elements - 20 * t < 512, "the rest is the header: ids and mask (16 bytes a token), scale (4)"


def test_wide_samples_are_sized_at_a_narrow_probe_width():
    assert _probe_hidden(SampleShape(4096, 3, 7168)) < 1024


def test_indices_of_one_pickle_width_size_alike():
    assert [same_size_index(i) for i in (0, 255, 256, 65535, 65536, 2**31 - 1)] == [0, 0, 256, 256, 65536, 65536]
    assert same_size_index(2**31) == same_size_index(2**32 - 1) == 2**31


@pytest.mark.parametrize("fmt", ["specforge", "speculators-v1", "modelopt"])
def test_every_token_count_is_exact_once_its_overhead_class_is_known(fmt):
    for tokens in [*range(1, 400, 3), 65535, 65536]:
        shape = SampleShape(tokens, 3, 8, torch.bfloat16, tokens)
        assert get_format(fmt).sample_file_bytes(shape) == _encoded_bytes(fmt, shape), tokens
