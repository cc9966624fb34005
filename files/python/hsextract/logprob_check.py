"""Do a sample's captured final rows give the server's own prompt log-probabilities?

The greedy check (`hsextract.greedy_check`) compares one argmax; a final state that is wrong in
a way that keeps the argmax (a scale: pre-norm rows taken for post-norm ones; a layer close to the
last) passes it most of the time. This check compares whole distributions: the final hidden
state of each checked prompt position, through the final RMSNorm where it is stored pre-norm and
the model's ``lm_head`` (the logits in the head's own dtype, as the server computes them), then a
log-softmax over the whole vocabulary, must give the logprobs the server itself returns for that
prompt (`hsextract.server_logprobs`): at each checked position, the server's top ``k`` tokens and
the token that follows the position.

Positions: every position of a prompt of up to `DEFAULT_MAX_POSITIONS` tokens; of a longer one,
that many spread evenly from the first to the last. The log-softmax needs the log-sum-exp over
all of the head's rows for each position: it is kept running (online: max and scaled sum, in
float32) over the same chunked pass over the head the greedy check makes (64 MiB chunks, nothing
mapped or loaded whole), with the logits of the ids to compare picked out as their chunk goes by.

The bound, measured on CPU against the real SGLang 0.5.23 server and its tiny models (10 prompts
of 3 to 300 tokens each; the server's top 5 and the next token at up to 64 positions; the greedy
check's verdict on the same rows beside it; tests/capture/test_logprob_check.py):

===========================================  =================  ===========  ===========
final rows given                              mean abs error     largest one  greedy pass
===========================================  =================  ===========  ===========
the captured ones, post-norm (Llama)          0 (bit-exact)      0            10 / 10
the captured ones, pre-norm (Llama, DSV3)     0.0019 - 0.0040    0.031        10 / 10
transformers' float32 rows in bf16            0.0056 - 0.0124    0.29         10 / 10
the layer before (Llama, DSV3)                0.30 - 0.70        2.2          3-6 / 10
pre-norm rows taken for post-norm ones        1.9 - 2.3          5.2          10 / 10
===========================================  =================  ===========  ===========

A set of FP8 rows (``--precision fp8``) is checked on its rows dequantized, as the trainer reads
them, against a bound of its own, ``FP8_MAX_MEAN_ABS_ERROR`` = 0.25. On the tiny Llama the captured
pre-norm rows through FP8 gave 0.026-0.027 (largest one 0.11), the layer before through FP8 0.37-0.53
(3 prompts of 10 to 100 tokens, tests/drain/test_fp8_selfcheck.py); on a trained model,
SmolLM2-135M-Instruct (12 GSM8K prompts, bench/fp8_logprob_error.py), the captured bf16 rows gave
0.020-0.031, through FP8 0.088-0.104 (three of twelve above 0.1), the layer before 2.6-4.0.

(Post-norm rows taken for pre-norm ones cannot be told apart on these models: their final norm's
weights are all 1, so a second normalisation changes nothing, for the server as for the check.)
The bound, `DEFAULT_MAX_MEAN_ABS_ERROR` = 0.1, is 8 times the bf16 drift of a float32 computation
and a third of the smallest wrong case. The post-norm rows match bit for bit because the check
computes the logits as the server does (the head's dtype, float32 log-sum-exp); pre-norm rows
differ by the final norm's rounding. Two forwards of one prompt in different batches differ on a
GPU by a few bf16 roundings more: on an H100 (the GPU tier, bench/gpu, 2026-12-05) the captured
rows gave 0.0059 (tiny Llama) and 0.0086 (tiny DeepSeek-V3) at worst, the 8B shape in the product
0.028-0.047, and the layer before 0.28-0.66. ``--selfcheck-logprob-bound`` sets another bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hsextract.greedy_check import BF16_REL_TIE, GreedyHead, GreedyVerdict, HeadQuery
from hsextract.server_logprobs import DEFAULT_MAX_MEAN_ABS_ERROR, DEFAULT_MAX_POSITIONS, ServerLogprobs


@dataclass(frozen=True)
class LogprobVerdict:
    ok: bool
    mean_abs_error: float
    max_abs_error: float
    compared: int  # logprob values compared
    positions: int  # prompt positions they come from
    worst_position: int
    bound: float

    def numbers(self) -> dict[str, float | int]:
        return {
            "mean_abs_error": self.mean_abs_error,
            "max_abs_error": self.max_abs_error,
            "compared": self.compared,
            "positions": self.positions,
            "worst_position": self.worst_position,
            "bound": self.bound,
        }

    def explain(self) -> str:
        return (
            f"the logprobs rebuilt from the captured final hidden states differ from the server's own: mean abs "
            f"error {self.mean_abs_error:.4g} > bound {self.bound:.4g} over {self.compared} values at "
            f"{self.positions} prompt positions (max {self.max_abs_error:.4g}, at position {self.worst_position}): "
            "the dump does not hold the final states the server computed (wrong layer or norm placement)"
        )


def checked_positions(prompt_len: int, most: int = DEFAULT_MAX_POSITIONS) -> list[int]:
    """Every position of a short prompt; of a long one, ``most`` spread evenly, first and last included."""
    if prompt_len <= most:
        return list(range(prompt_len))
    if most <= 1:
        return [prompt_len - 1]
    return sorted({round(i * (prompt_len - 1) / (most - 1)) for i in range(most)})


class LogprobPass:
    """Consumes the head's chunks (`hsextract.greedy_check.GreedyHead.scan`) for the rows of the
    checked positions: each position's running log-sum-exp, and the logits of the ids to compare."""

    def __init__(self, server: ServerLogprobs, positions: list[int]):
        self.positions = positions
        wanted = [list(dict.fromkeys([*server.top_ids[p], server.next_ids[p]])) for p in positions]
        width = max(len(w) for w in wanted)
        self.ids = torch.full((len(positions), width), -1, dtype=torch.int64)
        self.expected = torch.full((len(positions), width), float("nan"))
        for i, (p, ids) in enumerate(zip(positions, wanted, strict=True)):
            given = dict(zip(server.top_ids[p], server.top_values[p], strict=True))
            given[server.next_ids[p]] = server.next_values[p]
            self.ids[i, : len(ids)] = torch.tensor(ids)
            self.expected[i, : len(ids)] = torch.tensor([given[t] for t in ids])
        self.logits = torch.full(self.ids.shape, float("nan"))
        self.max = torch.full((len(positions),), float("-inf"))
        self.sum = torch.zeros(len(positions))

    def __call__(self, first: int, logits: torch.Tensor) -> None:
        top = logits.max(dim=1).values
        new_max = torch.maximum(self.max, top)
        self.sum = self.sum * torch.exp(self.max - new_max) + torch.exp(logits - new_max[:, None]).sum(dim=1)
        self.max = new_max
        inside = (self.ids >= first) & (self.ids < first + logits.shape[1])
        rows, cols = inside.nonzero(as_tuple=True)
        self.logits[rows, cols] = logits[rows, self.ids[rows, cols] - first]

    def verdict(self, bound: float = DEFAULT_MAX_MEAN_ABS_ERROR) -> LogprobVerdict:
        """Ours against the server's, over every compared value (an id outside the head counts as
        an infinite error)."""
        ours = self.logits - (self.max + torch.log(self.sum))[:, None]
        valid = self.ids >= 0
        err = (ours - self.expected).abs().nan_to_num(nan=float("inf"))[valid]
        per_row = torch.where(valid, (ours - self.expected).abs().nan_to_num(nan=float("inf")), 0.0)
        worst = int(per_row.max(dim=1).values.argmax())
        mean, most = float(err.mean()), float(err.max())
        return LogprobVerdict(
            mean <= bound, mean, most, int(valid.sum()), len(self.positions), self.positions[worst], bound
        )


@dataclass(frozen=True)
class SampleRows:
    """A sample's final hidden states where the checks read them: ``rows`` ``[len(positions), H]``
    at the prompt ``positions`` (ascending, the prompt's last one last: the greedy check's row)."""

    rows: torch.Tensor
    positions: list[int]
    final_hidden: str
    token: int  # the server's greedy token
    tie: float = BF16_REL_TIE  # the greedy check's relative tolerance (FP8_REL_TIE for dequantized FP8 rows)


def check_samples(
    head: GreedyHead,
    samples: Sequence[tuple[SampleRows, ServerLogprobs | None]],
    *,
    bound: float = DEFAULT_MAX_MEAN_ABS_ERROR,
) -> list[tuple[GreedyVerdict, LogprobVerdict | None]]:
    """For each sample and the server's logprobs of its prompt (None: the greedy check alone), the
    greedy verdict on its last row and the logprob verdict on its positions: one pass over the head
    for them all."""
    queries: list[HeadQuery] = []
    passes: list[LogprobPass | None] = []
    for s, server in samples:
        if server is None:
            queries.append(HeadQuery(s.rows[-1:], s.final_hidden, s.token, tie=s.tie))
            passes.append(None)
            continue
        if server.positions != s.positions[-1] + 1:
            raise ValueError(
                f"the server's logprobs cover {server.positions} positions, the dump {s.positions[-1] + 1}"
            )
        lp = LogprobPass(server, s.positions)
        queries.append(HeadQuery(s.rows, s.final_hidden, s.token, also=[lp], tie=s.tie))
        passes.append(lp)
    verdicts = head.check_many(queries)
    return [(g, None if lp is None else lp.verdict(bound)) for g, lp in zip(verdicts, passes, strict=True)]


def check_final_rows(
    head: GreedyHead,
    final_rows: torch.Tensor,
    final_hidden: str,
    token: int,
    server: ServerLogprobs | None,
    *,
    most: int = DEFAULT_MAX_POSITIONS,
    bound: float = DEFAULT_MAX_MEAN_ABS_ERROR,
    tie: float = BF16_REL_TIE,
) -> tuple[GreedyVerdict, LogprobVerdict | None]:
    """The greedy verdict on the last of a sample's final rows ``[P, H]`` (within `tie`: FP8_REL_TIE for
    dequantized FP8 rows), and, given the server's logprobs of its prompt, the logprob verdict on its
    checked positions: one pass over the head."""
    if server is not None and server.positions != final_rows.shape[0]:
        raise ValueError(f"the server's logprobs cover {server.positions} positions, the dump {final_rows.shape[0]}")
    positions = checked_positions(final_rows.shape[0], most if server is not None else 1)
    sample = SampleRows(final_rows[positions], positions, final_hidden, token, tie)
    return check_samples(head, [(sample, server)], bound=bound)[0]
