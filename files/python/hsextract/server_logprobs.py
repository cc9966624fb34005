"""The server's own log-probabilities of a prompt, by position, for the logprob self-check.

One ``/generate`` request: the prompt's ids, ``return_logprob``, ``logprob_start_len: 0`` and
``top_logprobs_num: k``, one new token at temperature 0. It carries **no rid**: SGLang makes one
up (a uuid's 32 hex digits, no dash), which never has the form ``<prefix>-...`` the capture
writes, so nothing of it is staged, whatever the run's rid prefix.

SGLang 0.5.23 answers in ``meta_info`` (``hsextract``'s reading of
``TokenizerManager.add_logprob_to_meta_info``):

- ``input_token_logprobs``: one ``[logprob, token id, text]`` per prompt token; entry ``i`` is the
  logprob of token ``i`` given the tokens before it, computed from the final hidden state of
  position ``i - 1``; entry 0 has no logprob (``null``).
- ``input_top_logprobs``: per prompt token, the ``k`` best ``[logprob, token id, text]`` of the same
  distribution (entry 0 ``null``).
- ``output_token_logprobs`` / ``output_top_logprobs``: the same for the generated token, whose
  distribution is the one of the prompt's last position.

So position ``p`` of the prompt (``0 <= p < P``) has the distribution of entry ``p + 1`` of the
input lists, and the last position the output's. Those logprobs are the log-softmax of the raw
logits (no temperature), in float32 over logits the head computed in the model's dtype.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

# The logprob check's settings (hsextract.logprob_check), here, free of torch, for the commands' flags:
DEFAULT_TOP_K = 5  # the server's best k tokens compared at each position, beside the next token
DEFAULT_MAX_POSITIONS = 64  # prompt positions checked: all of a shorter prompt, this many spread over a longer one
DEFAULT_MAX_MEAN_ABS_ERROR = 0.1  # the bound on the mean absolute error (measured: hsextract.logprob_check)
# The bound for FP8 rows checked dequantized: FP8's rounding alone moved a trained model's logprobs by up
# to 0.104 (SmolLM2-135M, bench/fp8_logprob_error.py), a one-layer offset by 0.37 and more.
FP8_MAX_MEAN_ABS_ERROR = 0.25


def bound_for(fp8: bool, given: float | None = None) -> float:
    """The logprob check's bound for rows of a set: the one given (``--selfcheck-logprob-bound``), else
    the precision's own."""
    if given is not None:
        return given
    return FP8_MAX_MEAN_ABS_ERROR if fp8 else DEFAULT_MAX_MEAN_ABS_ERROR


DEFAULT_TIMEOUT_S = 60.0


class LogprobsUnavailable(Exception):
    """The server gave no usable log-probabilities (unreachable, an error, an answer of another
    shape); `retry` says whether asking again at once may help, `timed_out` that it did not answer
    in time (busy or stuck: asking again at once would only add to its load)."""

    def __init__(self, detail: str, retry: bool = True, timed_out: bool = False):
        super().__init__(detail)
        self.retry = retry and not timed_out
        self.timed_out = timed_out


@dataclass(frozen=True)
class ServerLogprobs:
    """The server's distributions at each prompt position ``p`` (``0 <= p < P``): the ids and
    logprobs of its top ``k``, and of the token that follows ``p`` (the next prompt token; after
    the last position, the token the server generated)."""

    top_ids: list[list[int]]
    top_values: list[list[float]]
    next_ids: list[int]
    next_values: list[float]

    @property
    def positions(self) -> int:
        return len(self.next_ids)


def payload(input_ids: list[int], top_k: int) -> dict[str, Any]:
    """The request: no rid (see the module docstring), one greedy token, every position's top ``k``."""
    return {
        "input_ids": list(input_ids),
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": int(top_k),
    }


def fetch(
    url: str, input_ids: list[int], top_k: int = DEFAULT_TOP_K, timeout_s: float = DEFAULT_TIMEOUT_S
) -> ServerLogprobs:
    """Ask the server at ``url`` for the logprobs of the prompt ``input_ids``; LogprobsUnavailable
    saying what went wrong where."""
    endpoint = url.rstrip("/") + "/generate"
    body = json.dumps(payload(input_ids, top_k)).encode()
    request = urllib.request.Request(endpoint, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        text = exc.read()[:200].decode(errors="replace")
        raise LogprobsUnavailable(
            f"{endpoint}: HTTP {exc.code}: {text}", retry=exc.code >= 500 or exc.code in (408, 429)
        ) from None
    except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, reset, timed out, garbled
        timed_out = isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError)
        raise LogprobsUnavailable(
            f"{endpoint}: {type(exc).__name__}: {str(exc)[:200]}"
            + (f" (no answer within {timeout_s:g} s)" if timed_out else ""),
            timed_out=timed_out,
        ) from None
    return parse(answer, list(input_ids), endpoint)


def parse(answer: Any, input_ids: list[int], where: str = "the server") -> ServerLogprobs:
    """The answer's logprobs by position (see the module docstring); LogprobsUnavailable (no retry)
    when it is not the shape SGLang 0.5.23 gives."""
    try:
        meta = answer["meta_info"]
        inputs, tops = meta["input_token_logprobs"], meta["input_top_logprobs"]
        output, output_top = meta["output_token_logprobs"][0], meta["output_top_logprobs"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise LogprobsUnavailable(
            f"{where}: the answer has no prompt logprobs ({type(exc).__name__}: {exc}); is it SGLang 0.5.23?",
            retry=False,
        ) from None
    n = len(input_ids)
    if len(inputs) != n or len(tops) != n:
        raise LogprobsUnavailable(
            f"{where}: logprobs for {len(inputs)} prompt tokens ({len(tops)} top lists), the prompt has {n}",
            retry=False,
        )
    given = [int(e[1]) for e in inputs]
    if given != input_ids:
        first = next(i for i, (a, b) in enumerate(zip(given, input_ids, strict=True)) if a != b)
        raise LogprobsUnavailable(
            f"{where}: its logprobs are of token {given[first]} at position {first}, the prompt has {input_ids[first]}",
            retry=False,
        )
    entries = [*inputs[1:], output]
    top_lists = [*tops[1:], output_top]
    try:
        return ServerLogprobs(
            top_ids=[[int(e[1]) for e in t] for t in top_lists],
            top_values=[[float(e[0]) for e in t] for t in top_lists],
            next_ids=[int(e[1]) for e in entries],
            next_values=[float(e[0]) for e in entries],
        )
    except (TypeError, ValueError, IndexError) as exc:  # a position without logprobs (null), or not numbers
        raise LogprobsUnavailable(f"{where}: a prompt position without usable logprobs ({exc})", retry=False) from None
