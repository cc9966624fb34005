"""The longest prompt the server runs, and the length the client cuts samples to.

SGLang 0.5.23 refuses a prompt in two places (``sglang/srt/managers``):

* the tokenizer manager, when ``len >= context_len`` (the model's context, or the server's
  ``--context-length``);
* the scheduler (``utils.validate_input_length``), when ``len >= max_req_input_len``, where
  ``tp_worker.get_worker_info`` sets ``max_req_len = min(context_len - 1, kv_pool_tokens - 1)``
  and ``max_req_input_len = max_req_len - 5``.

The scheduler's is the stricter, and its bound is exclusive: with a 2048-token context the
longest prompt is 2041 tokens, and a prompt of 2042 gets "Input length (2042 tokens) exceeds the
maximum allowed length (2042 tokens)". A client that cut samples at context - 1 would have every
long sample refused (HTTP 400) instead of truncated, so the client asks the running server
(`/server_info` reports ``max_req_input_len`` and the KV pool's size) and ``hsextract plan``,
which runs before any server, computes the same figure from the model's config and the server
settings it is given. Both go through `longest_prompt`.
"""

from __future__ import annotations

import logging

log = logging.getLogger("hsextract.client")

# max_req_input_len = max_req_len - 5 (sglang/srt/managers/tp_worker.py, get_worker_info)
SCHEDULER_RESERVE = 5


def longest_prompt(context_len: int, kv_pool_tokens: int | None = None, max_req_input_len: int | None = None) -> int:
    """The longest prompt (in tokens) SGLang 0.5.23 runs for a model of `context_len` tokens.

    ``max_req_input_len`` is the server's own figure (``/server_info``) where it reports it: it
    also covers what the rule cannot know (a diffusion model's block size); without it the figure
    is computed from the context and the KV pool's size (None: the pool holds a whole context).
    """
    if max_req_input_len is None:
        max_req_len = context_len - 1 if not kv_pool_tokens else min(context_len - 1, kv_pool_tokens - 1)
        max_req_input_len = max_req_len - SCHEDULER_RESERVE
    return min(max_req_input_len - 1, context_len - 1)  # both refusals are `len >= bound`


def resolve_max_tokens(
    requested: int | None, default: int, longest: int | None, where: str = "", quiet: bool = False
) -> int:
    """The length samples are cut to: the requested one (else `default`), but never longer than the
    server runs (`longest`, None where unknown). A request over it is lowered, with a log line that
    says so (unless `quiet`), since every sample longer than that would be refused by the server."""
    if longest is None:
        return requested if requested is not None else default
    if requested is None:
        return min(default, longest)
    if requested > longest:
        if not quiet:
            log.warning(
                "--max-tokens %d is more than the server runs (%d tokens%s): samples are cut at %d tokens",
                requested,
                longest,
                f", {where}" if where else "",
                longest,
            )
        return longest
    return requested
