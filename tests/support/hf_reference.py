"""Reference hidden states from transformers, for checking what the server captured.

The reference runs the same bf16 weights in float32 with ``output_hidden_states=True``; the
final norm's input and output are taken with a hook, so the pre- and post-norm final hidden
states are exact whatever transformers puts last in ``hidden_states``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch


@dataclass
class Reference:
    hidden_states: tuple[torch.Tensor, ...]  # [T, H] each; index 0 = embeddings, i = output of layer i-1
    pre_norm: torch.Tensor  # [T, H] residual stream entering the final norm
    post_norm: torch.Tensor  # [T, H] final norm output
    logits: torch.Tensor  # [T, V]


@lru_cache(maxsize=4)
def _model(model_dir: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.eval()
    return model


def reference(model_dir: str | Path, input_ids: list[int]) -> Reference:
    model = _model(str(model_dir))
    seen: dict[str, torch.Tensor] = {}

    def hook(module, args, output):
        seen["pre"] = args[0].detach()
        seen["post"] = output.detach()

    handle = model.model.norm.register_forward_hook(hook)
    try:
        with torch.no_grad():
            out = model(torch.tensor([input_ids]), output_hidden_states=True)
    finally:
        handle.remove()
    return Reference(
        hidden_states=tuple(h[0] for h in out.hidden_states),
        pre_norm=seen["pre"][0],
        post_norm=seen["post"][0],
        logits=out.logits[0],
    )


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative L2 error of ``a`` against the reference ``b``."""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))
