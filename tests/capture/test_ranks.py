"""One writer per attention data-parallel group, on the rank layout SGLang itself uses."""

from __future__ import annotations

import pytest
from hsextract.capture.ranks import attention_dp_size, attention_ranks, writes_dumps
from hsextract.errors import ConfigError

CONFIGS = [(1, 1), (2, 1), (8, 1), (8, 2), (8, 4), (8, 8), (16, 8)]  # (tp_size, attention DP size)


@pytest.mark.parametrize(("tp_size", "attn_dp"), CONFIGS)
def test_ranks_match_sglangs_own_derivation(tp_size, attn_dp):
    from sglang.srt.runtime_context import derive_attention_ranks, derive_attn_tp_size

    attn_tp = derive_attn_tp_size(tp_size=tp_size, attn_cp_size=1, attn_dp_size=attn_dp)
    for tp_rank in range(tp_size):
        theirs = derive_attention_ranks(tp_rank=tp_rank, attn_tp_size=attn_tp, attn_cp_size=1)
        assert attention_ranks(tp_rank=tp_rank, tp_size=tp_size, attn_dp_size=attn_dp) == tuple(theirs)


@pytest.mark.parametrize(("tp_size", "attn_dp"), CONFIGS)
def test_each_attention_dp_group_has_exactly_one_writer(tp_size, attn_dp):
    writers = [attention_ranks(tp_rank=r, tp_size=tp_size, attn_dp_size=attn_dp) for r in range(tp_size)]
    groups = sorted(dp for tp, dp in writers if writes_dumps(tp))
    assert groups == list(range(attn_dp))


def test_the_deprecated_dp_attention_flags_count_as_attention_dp():
    assert attention_dp_size(attn_dp_size=1, dp_size=8, enable_dp_attention=True) == 8
    assert attention_dp_size(attn_dp_size=4, dp_size=1, enable_dp_attention=False) == 4
    assert attention_dp_size(attn_dp_size=1, dp_size=8, enable_dp_attention=False) == 1  # plain DP: own servers


def test_a_tp_size_the_attention_dp_size_does_not_divide_is_refused():
    with pytest.raises(ConfigError, match="not a multiple"):
        attention_ranks(tp_rank=0, tp_size=6, attn_dp_size=4)
