"""Reference hidden states from transformers, for checking what the server captured.

The reference runs the same bf16 weights in float32 with ``output_hidden_states=True``; the
final norm's input and output are taken with a hook, so the pre- and post-norm final hidden
states are exact whatever transformers puts last in ``hidden_states``. `row_problems` holds the
bounds a captured dump must meet; the CPU server tests and the GPU tier (bench/gpu) share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

# Error bounds of bf16 serving against a float32 transformers run of the same weights, measured
# per captured layer over the whole prompt (relative L2). Dense Llama: ~0.5 %, bound 2 %. Tiny
# DeepSeek-V3: ~0.5 % on most tokens, but bf16 rounding flips a top-2 expert choice on the odd
# token (6-12 % on that token), so the whole-prompt bound is 5 % and the median token must stay
# under 1 %. A wrong layer index is off by > 30 %, so each slot must also be 10x closer to its
# own index than to either neighbour.
REL_ERR_BOUND = {"LlamaForCausalLM": 0.02, "DeepseekV3ForCausalLM": 0.05}
MEDIAN_TOKEN_BOUND = 0.01


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


def reference(model_dir: str | Path, input_ids: list[int], model=None) -> Reference:
    """The reference of ``input_ids``: from the model of ``model_dir`` in float32 on the CPU, or from
    ``model`` (a transformers model already loaded, on any device; the results come back on the CPU)."""
    model = model if model is not None else _model(str(model_dir))
    device = next(model.parameters()).device
    seen: dict[str, torch.Tensor] = {}

    def hook(module, args, output):
        seen["pre"] = args[0].detach()
        seen["post"] = output.detach()

    handle = model.model.norm.register_forward_hook(hook)
    try:
        with torch.no_grad():
            out = model(torch.tensor([input_ids], device=device), output_hidden_states=True)
    finally:
        handle.remove()
    return Reference(
        hidden_states=tuple(h[0].cpu() for h in out.hidden_states),
        pre_norm=seen["pre"][0].cpu(),
        post_norm=seen["post"][0].cpu(),
        logits=out.logits[0].cpu(),
    )


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative L2 error of ``a`` against the reference ``b``."""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def median_token_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Median over tokens of the per-token relative L2 error of ``a`` [T, H] against ``b``."""
    a, b = a.float(), b.float()
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-12)).median())


def row_problems(
    hidden: torch.Tensor,
    layers_to_capture: list[int],
    architecture: str,
    ref: Reference,
    final_hidden: str = "post_norm",
    median_bound: float = MEDIAN_TOKEN_BOUND,
) -> list[str]:
    """What is wrong with captured rows ``hidden`` [T, K+1, H] against the reference (empty: nothing):
    each aux slot and the final hidden state within the bounds, and each slot far from its neighbours."""
    bound = REL_ERR_BOUND[architecture]
    problems = []
    for slot, layer in enumerate(layers_to_capture):
        got, want = hidden[:, slot], ref.hidden_states[layer]
        err = rel_err(got, want)
        if err >= bound:
            problems.append(f"aux slot {slot} (layers_to_capture {layer}): rel. err {err:.4f} >= {bound}")
        median = median_token_err(got, want)
        if median >= median_bound:
            problems.append(f"aux slot {slot}: median token rel. err {median:.4f} >= {median_bound}")
        for other in (layer - 1, layer + 1):
            if rel_err(got, ref.hidden_states[other]) <= 10 * err:
                problems.append(f"aux slot {slot} also matches layer {other}")
    final_ref = ref.post_norm if final_hidden == "post_norm" else ref.pre_norm
    err = rel_err(hidden[:, -1], final_ref)
    if err >= bound:
        problems.append(f"final hidden ({final_hidden}): rel. err {err:.4f} >= {bound}")
    median = median_token_err(hidden[:, -1], final_ref)
    if median >= median_bound:
        problems.append(f"final hidden ({final_hidden}): median token rel. err {median:.4f} >= {median_bound}")
    return problems
