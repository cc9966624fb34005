"""Sampling settings of the regeneration: the model's own defaults unless the user says otherwise.

A drafter learns the distribution the target is served with, so the replies are sampled as the
model's authors recommend: temperature, top_p and top_k from ``generation_config.json`` (with
``do_sample: false`` meaning greedy). A model without one is sampled greedily (temperature 0).
Flags override each value. ``max_new_tokens`` defaults to 4096 and never exceeds the context.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hsextract.errors import ConfigError

log = logging.getLogger("hsextract.regen")

DEFAULT_MAX_NEW_TOKENS = 4096


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    source: str = "default"  # where the defaults came from, for the run's settings record

    def request_fields(self) -> dict[str, Any]:
        """The sampling fields of a ``/v1/chat/completions`` request."""
        out: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_new_tokens}
        if self.top_p is not None:
            out["top_p"] = self.top_p
        if self.top_k is not None and self.top_k > 0:
            out["top_k"] = self.top_k
        return out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def generation_defaults(model_dir: Path | None) -> tuple[dict[str, Any], str]:
    """(temperature/top_p/top_k found, where) from the model's generation_config.json."""
    if model_dir is None:
        return {}, "default"
    path = Path(model_dir) / "generation_config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, "default"
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: unreadable ({exc}); fix it or pass --temperature/--top-p/--top-k") from exc
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: not a JSON object")
    out: dict[str, Any] = {}
    if cfg.get("do_sample") is False:
        out["temperature"] = 0.0
    elif isinstance(cfg.get("temperature"), (int, float)):
        out["temperature"] = float(cfg["temperature"])
    if isinstance(cfg.get("top_p"), (int, float)):
        out["top_p"] = float(cfg["top_p"])
    if isinstance(cfg.get("top_k"), int) and not isinstance(cfg.get("top_k"), bool):
        out["top_k"] = int(cfg["top_k"])
    return out, str(path) if out else "default"


def resolve(
    model_dir: Path | None,
    context_len: int | None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    max_new_tokens: int | None = None,
) -> Sampling:
    """The sampling settings of a run: flags, else the model's generation config, else greedy."""
    found, source = generation_defaults(model_dir)
    values = {"temperature": 0.0, **found}
    for key, flag in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k)):
        if flag is not None:
            values[key] = flag
    if values["temperature"] < 0:
        raise ConfigError(f"temperature {values['temperature']}: must be >= 0")
    if values.get("top_p") is not None and not 0 < values["top_p"] <= 1:
        raise ConfigError(f"top_p {values['top_p']}: must be in (0, 1]")
    n = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
    if n < 1:
        raise ConfigError(f"max new tokens {n}: must be at least 1")
    if context_len and n >= context_len:
        log.info("max new tokens %d lowered to %d: the model's context is %d tokens", n, context_len - 1, context_len)
        n = context_len - 1
    return Sampling(values["temperature"], values.get("top_p"), values.get("top_k"), n, source)
