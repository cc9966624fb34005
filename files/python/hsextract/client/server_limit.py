"""Ask the running server how long a prompt it runs (the adapter of `hsextract.prompt_limit`).

SGLang's ``/server_info`` carries the scheduler's ``max_req_input_len`` and the KV pool's size
(``max_total_num_tokens``), ``/v1/models`` the context length it serves (``max_model_len``).
The figure depends on settings the client cannot see otherwise (``--context-length``, the pool
SGLang sized from free GPU memory), so it is asked for, not computed from the model's config.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import requests

from hsextract.prompt_limit import longest_prompt

log = logging.getLogger("hsextract.client")


@dataclass(frozen=True)
class ServerLimit:
    longest: int  # the longest prompt the server runs, in tokens
    source: str  # where the figure comes from, for the log


def _get(url: str, timeout: float) -> dict[str, Any] | None:
    try:
        resp = requests.get(url, timeout=timeout)
        data = resp.json() if resp.status_code == 200 else None
    except (requests.RequestException, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def server_limit(base_url: str, model_context: int, timeout: float = 30.0) -> ServerLimit | None:
    """The running server's limit, or None (with a log line) when it does not say."""
    base = base_url.rstrip("/")
    info = _get(f"{base}/server_info", timeout) or _get(f"{base}/get_server_info", timeout) or {}
    models = _get(f"{base}/v1/models", timeout) or {}
    cards = models.get("data") if isinstance(models.get("data"), list) else []
    context = (
        (_int(cards[0].get("max_model_len")) if cards and isinstance(cards[0], dict) else None)
        or _int(info.get("context_length"))
        or None
    )
    reported = _int(info.get("max_req_input_len"))
    if reported is None and context is None:
        log.warning(
            "server %s does not report its prompt limit (/server_info, /v1/models); samples are cut to "
            "the model's context (%d tokens) as SGLang 0.5.23 computes it",
            base,
            model_context,
        )
        return None
    context = context or model_context
    longest = longest_prompt(context, _int(info.get("max_total_num_tokens")), reported)
    source = (
        f"the server's max_req_input_len {reported}"
        if reported is not None
        else f"the server's context of {context} tokens"
    )
    return ServerLimit(longest, source)
