"""A model directory's weights, read by name without loading the model: where each tensor lives,
and the final RMSNorm that turns a pre-norm final state into the post-norm one the head reads.

The greedy and logprob self-checks read the head and the norm through this (hsextract.greedy_check);
``--to-bf16`` into a format that stores the post-norm final state reads the norm (hsextract.formats
.to_bf16), since a set of FP8 rows holds the pre-norm one (the speculators format's).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hsextract.errors import ConfigError

# Where a checkpoint's language model sits: at the top, or inside a multimodal model's wrapper.
PREFIXES = ("", "language_model.", "model.language_model.")
DEFAULT_RMS_NORM_EPS = 1e-6


def rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32, the weight applied before any rounding (as SGLang's fused kernel does)."""
    h = h.float()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header and the offset its data starts at."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def weight_map(model_path: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file, from the index or by reading every file's header."""
    index = model_path / "model.safetensors.index.json"
    if index.is_file():
        return {k: model_path / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    found: dict[str, Path] = {}
    for p in sorted(model_path.glob("*.safetensors")):
        found.update((k, p) for k in read_header(p)[0] if k != "__metadata__")
    return found


@dataclass(frozen=True)
class FinalNorm:
    """The model's final RMSNorm: its weight (float32) and epsilon."""

    weight: torch.Tensor
    eps: float
    model: Path

    def apply(self, rows: torch.Tensor) -> torch.Tensor:
        """The pre-norm rows ``[..., H]`` through the norm, in float32."""
        return rms_norm(rows, self.weight, self.eps)


def read_final_norm(model: Path, what: str) -> FinalNorm:
    """The final norm of the model directory `model` (ConfigError, saying `what` needs it, when the
    directory has no config.json or no final norm weight)."""
    try:
        config: dict[str, Any] = json.loads((model / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{what}: cannot read {model / 'config.json'}: {exc}") from exc
    text = config.get("text_config") or config
    try:
        names = weight_map(model)
    except (OSError, ValueError, KeyError, struct.error) as exc:
        raise ConfigError(f"{what}: cannot read the weights of {model}: {exc}") from exc
    name = next((n for n in (f"{p}model.norm.weight" for p in PREFIXES) if n in names), "")
    if not name:
        raise ConfigError(f"{what}: {model} has no final norm weight (model.norm.weight)")
    from safetensors import safe_open

    with safe_open(str(names[name]), framework="pt") as f:
        weight = f.get_tensor(name).float()
    return FinalNorm(weight, float(text.get("rms_norm_eps", DEFAULT_RMS_NORM_EPS)), model)
