"""Which server processes write dumps: one per attention data-parallel group.

Under tensor parallelism every TP rank runs every request and holds the same hidden states, so one
rank must write them. Under DP attention the TP group is split into attention-DP groups that run
different requests; each group's first attention-TP rank writes that group's requests. SGLang lays
ranks out as (dp, cp, tp) with tp changing fastest::

    tp_rank = (attn_dp_rank * attn_cp_size + attn_cp_rank) * attn_tp_size + attn_tp_rank

SGLang publishes these ranks itself (`sglang.srt.runtime_context.get_parallel`); this derivation is
the fallback when that is not available yet, and the tests check it against SGLang's own.
"""

from __future__ import annotations

from hsextract.errors import ConfigError


def attention_dp_size(*, attn_dp_size: int, dp_size: int, enable_dp_attention: bool) -> int:
    """The attention-DP width from server arguments, in 0.5.23's spelling or the deprecated one."""
    if attn_dp_size > 1:
        return attn_dp_size
    return dp_size if enable_dp_attention and dp_size > 1 else 1


def attention_ranks(*, tp_rank: int, tp_size: int, attn_dp_size: int, attn_cp_size: int = 1) -> tuple[int, int]:
    """(attention-TP rank, attention-DP rank) of the process at `tp_rank`."""
    if tp_size < 1 or attn_dp_size < 1 or attn_cp_size < 1 or tp_size % (attn_dp_size * attn_cp_size):
        raise ConfigError(
            f"tp_size {tp_size} is not a multiple of attention DP {attn_dp_size} x attention CP {attn_cp_size}"
        )
    if not 0 <= tp_rank < tp_size:
        raise ConfigError(f"tp_rank {tp_rank} is outside 0..{tp_size - 1}")
    attn_tp_size = tp_size // attn_dp_size // attn_cp_size
    return tp_rank % attn_tp_size, tp_rank // (attn_tp_size * attn_cp_size)


def writes_dumps(attn_tp_rank: int) -> bool:
    """Whether this process writes its attention-DP group's dumps."""
    return attn_tp_rank == 0
