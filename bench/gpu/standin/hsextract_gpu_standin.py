"""An SGLang plugin of the GPU test tier: an unquantized MoE that a decode CUDA graph can capture.

Without the real kernels (``SGLANG_FORCE_FUSED_OP_BACKEND=torch``) SGLang 0.5.23 runs an
unquantized fused MoE through ``moe_forward_native``, which copies the per-expert token counts to
the host to loop over the experts. A host copy is not allowed while a CUDA graph is captured, so
a DeepSeek server of the tier could only run with decode graphs off. While a graph is being
captured, this plugin computes the same MoE by gathering each token's expert weights (fixed
shapes, no host copy: the form of SGLang's own ``fused_moe_forward_native``, which it uses under
torch.compile); every eager call, so every prefill and every captured hidden state, still runs
SGLang's own function. The gather holds ``tokens x top-k`` copies of an expert's weights, which
is nothing for the tier's tiny models and decode batches, and far too much for a real model.

SGLang's plugin framework loads it in every server process, before any model is built, through
the entry point in ``hsextract_gpu_standin-1.0.dist-info`` (this directory is on PYTHONPATH).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

TARGET = "sglang.srt.layers.moe.fused_moe_native.moe_forward_native"

log = logging.getLogger("hsextract_gpu_standin")


def gathered_moe(layer, x: torch.Tensor, topk_output, moe_runner_config) -> torch.Tensor:
    """``moe_forward_native``'s result without a host copy: per token, its top-k experts' SiLU MLPs,
    weighted by the router and summed in float32."""
    topk_weights, topk_ids, _ = topk_output
    gate, up = layer.w13_weight[topk_ids].chunk(2, dim=2)  # [T, K, I, H] each
    h = F.silu(torch.einsum("th,tkih->tki", x, gate)) * torch.einsum("th,tkih->tki", x, up)
    out = torch.einsum("tki,tkhi->tkh", h, layer.w2_weight[topk_ids])  # w2: [E, H, I]
    return (out.float() * topk_weights.float().unsqueeze(-1)).sum(dim=1).to(x.dtype)


def gathered_moe_supports(layer, moe_runner_config) -> bool:
    """The cases `gathered_moe` computes exactly as SGLang does (plain SiLU experts, no biases)."""
    return (
        moe_runner_config.activation == "silu"
        and moe_runner_config.gemm1_alpha is None
        and not moe_runner_config.apply_router_weight_on_input
        and getattr(layer, "w13_weight_bias", None) is None
        and getattr(layer, "w2_weight_bias", None) is None
    )


def moe_forward_native_graph_safe(original, layer, x, topk_output, moe_runner_config):
    """Around SGLang's ``moe_forward_native``: `gathered_moe` while a CUDA graph is captured."""
    if x.is_cuda and torch.cuda.is_current_stream_capturing() and gathered_moe_supports(layer, moe_runner_config):
        return gathered_moe(layer, x, topk_output, moe_runner_config)
    return original(layer, x, topk_output, moe_runner_config)


def register() -> None:
    """SGLang's general-plugin entry point: hook `moe_forward_native_graph_safe` around the target."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, moe_forward_native_graph_safe, HookType.AROUND)
    log.warning("hsextract GPU tier: MoE graph-safe while a CUDA graph is captured (%s)", TARGET)
