"""The logprob check's arithmetic without a server: a log-softmax over the whole vocabulary kept
running over the head's chunks, and the positions a long prompt is checked at (hsextract.logprob_check)."""

from __future__ import annotations

import json

import pytest
import torch
from hsextract.greedy_check import GreedyHead
from hsextract.logprob_check import LogprobPass, checked_positions
from hsextract.server_logprobs import LogprobsUnavailable, ServerLogprobs, parse


def test_the_chunked_log_softmax_is_the_whole_vocabularys(tmp_path):
    """Many small chunks (a running log-sum-exp) give what one log-softmax over the whole head gives."""
    from safetensors.torch import save_file

    vocab, hidden, n = 1000, 32, 7
    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(vocab, hidden, generator=g) * 2).bfloat16()
    save_file(
        {"lm_head.weight": weight, "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)},
        str(tmp_path / "model.safetensors"),
    )
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": hidden, "vocab_size": vocab}))
    rows = torch.randn(n, hidden, generator=g).bfloat16()
    whole = torch.log_softmax((rows @ weight.T).float(), dim=-1)
    top = whole.topk(5, dim=-1)
    nxt = torch.randint(0, vocab, (n,), generator=g)
    server = ServerLogprobs(
        top.indices.tolist(), top.values.tolist(), nxt.tolist(), whole[torch.arange(n), nxt].tolist()
    )
    head = GreedyHead(tmp_path, chunk_bytes=37 * hidden * 2)  # 37 rows a chunk: 28 chunks, the last short
    logprobs = LogprobPass(server, checked_positions(n))
    head.check_rows(rows, "post_norm", int(whole[-1].argmax()), also=[logprobs])
    verdict = logprobs.verdict()
    assert verdict.ok and verdict.max_abs_error < 1e-5, verdict
    assert verdict.compared == sum(len({*top.indices[i].tolist(), int(nxt[i])}) for i in range(n))


def test_a_long_prompt_is_checked_at_a_bounded_spread_of_positions():
    assert checked_positions(10) == list(range(10))
    spread = checked_positions(10_000, 64)
    assert len(spread) == 64 and spread[0] == 0 and spread[-1] == 9_999 and spread == sorted(set(spread))


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ({"meta_info": {"prompt_tokens": 3}}, "no prompt logprobs (KeyError"),
        (
            {
                "meta_info": {
                    "input_token_logprobs": [[None, 5, None], [-1.0, 6, None]],
                    "input_top_logprobs": [None, [[-1.0, 6, None]]],
                    "output_token_logprobs": [[-0.5, 9, None]],
                    "output_top_logprobs": [[[-0.5, 9, None]]],
                }
            },
            "logprobs for 2 prompt tokens",
        ),
        (
            {
                "meta_info": {
                    "input_token_logprobs": [[None, 5, None], [-1.0, 7, None], [-1.0, 8, None]],
                    "input_top_logprobs": [None, [[-1.0, 7, None]], [[-1.0, 8, None]]],
                    "output_token_logprobs": [[-0.5, 9, None]],
                    "output_top_logprobs": [[[-0.5, 9, None]]],
                }
            },
            "of token 7 at position 1",
        ),
        (
            {
                "meta_info": {
                    "input_token_logprobs": [[None, 5, None], [-1.0, 6, None], [None, 7, None]],
                    "input_top_logprobs": [None, [[-1.0, 6, None]], None],
                    "output_token_logprobs": [[-0.5, 9, None]],
                    "output_top_logprobs": [[[-0.5, 9, None]]],
                }
            },
            "a prompt position without usable logprobs",
        ),
    ],
)
def test_an_answer_of_another_shape_is_refused_for_good_saying_what_differs(answer, says):
    with pytest.raises(LogprobsUnavailable, match="the server") as caught:
        parse(answer, [5, 6, 7], "the server")
    assert says in str(caught.value) and not caught.value.retry
