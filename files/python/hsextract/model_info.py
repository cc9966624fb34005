"""Read what the project needs to know about a model from its config.json, without loading it.

Multimodal wrappers (Kimi-K2.5) keep the language model's settings under `text_config`; the
capture needs the text model's layer count and hidden size, so this module resolves that once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.errors import ConfigError


@dataclass(frozen=True)
class ModelInfo:
    """The facts about a model that the capture, drain and client depend on."""

    path: str
    architecture: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    torch_dtype: str
    config_sha256: str
    context_length: int = 2048  # tokens, as SGLang derives it from the config (`sglang_context_length`)

    @property
    def state_bytes_per_token(self) -> int:
        """Bytes of one token of one captured layer in bf16 (2 bytes per element)."""
        return self.hidden_size * 2


# SGLang 0.5.23's keys for the context length, in its order of preference
# (sglang/srt/utils/hf_transformers/common.py, get_context_length).
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
SGLANG_DEFAULT_CONTEXT = 2048


def sglang_context_length(text: dict[str, Any]) -> int:
    """The context length SGLang serves a model with when no ``--context-length`` is given.

    Computed as SGLang does, so that what the client and the plan cut samples to is what the
    server runs: the first key of `CONTEXT_LENGTH_KEYS` present, times the RoPE scaling factor
    (unless the scaling names its original length, or is Llama 3's), else 2048.
    """
    rope = text.get("rope_scaling") or text.get("rope_parameters")
    factor = 1.0
    if isinstance(rope, dict) and "original_max_position_embeddings" not in rope and rope.get("rope_type") != "llama3":
        factor = float(rope.get("factor", 1) or 1)
    for key in CONTEXT_LENGTH_KEYS:
        if text.get(key) is not None:
            return int(factor * int(text[key]))
    return SGLANG_DEFAULT_CONTEXT


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    text = cfg.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" in text:
        return text
    return cfg


def text_model_layers(cfg: dict[str, Any]) -> int | None:
    """The language model's layer count in a parsed config.json, or None when it does not say.

    For a caller that has the config but not the model directory: the Ansible role reads the
    file from the host and checks the aux layer ids on the controller with this count.
    """
    layers = _text_config(cfg).get("num_hidden_layers")
    return None if layers is None else int(layers)


def read_model_info(model_path: str | Path) -> ModelInfo:
    """Read `config.json` of a model directory; raise ConfigError naming the path if it is unusable."""
    path = Path(model_path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(
            f"model path {path}: no config.json there; point the model path at a Hugging Face model directory"
        )
    raw = cfg_file.read_bytes()
    try:
        cfg = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{cfg_file}: not valid JSON ({exc})") from exc
    archs = cfg.get("architectures") or []
    if not archs:
        raise ConfigError(f"{cfg_file}: no 'architectures' entry; cannot tell which model class SGLang will use")
    text = _text_config(cfg)
    try:
        layers = int(text["num_hidden_layers"])
        hidden = int(text["hidden_size"])
    except KeyError as exc:
        raise ConfigError(f"{cfg_file}: missing {exc.args[0]!r} (needed to place the capture layers)") from exc
    dtype = next(
        (str(c[k]) for c in (text, cfg) for k in ("torch_dtype", "dtype") if c.get(k)),
        "bfloat16",
    )
    return ModelInfo(
        path=str(path),
        architecture=str(archs[0]),
        num_hidden_layers=layers,
        hidden_size=hidden,
        vocab_size=int(text.get("vocab_size", cfg.get("vocab_size", 0)) or 0),
        torch_dtype=dtype,
        config_sha256=hashlib.sha256(raw).hexdigest(),
        context_length=sglang_context_length(text),
    )
