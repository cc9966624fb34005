"""The architectures the capture supports, and where SGLang keeps their pieces.

The capture patch subclasses SGLang's own model class under the same name, so that SGLang's
registry picks it up through SGLANG_EXTERNAL_MODEL_PACKAGE. Each entry says which SGLang module
holds that class and how to reach the inner decoder (the module whose forward returns the aux
hidden states) from the outer model.
"""

from __future__ import annotations

from dataclasses import dataclass

from hsextract.errors import UnsupportedArchitecture


@dataclass(frozen=True)
class ArchSpec:
    """Where SGLang 0.5.23 defines an architecture and how the capture reaches its decoder."""

    name: str
    sglang_module: str
    # Attribute path from the outer model to the *ForCausalLM that owns `set_eagle3_layers_to_capture`
    # and `model` (the decoder). Empty for the plain causal LMs; "language_model" for Kimi-K2.5.
    causal_lm_attr: str
    # The DeepSeek family's torch_native attention on CPU needs the absorbed-MLA path.
    mla: bool


SUPPORTED: dict[str, ArchSpec] = {
    spec.name: spec
    for spec in (
        ArchSpec("DeepseekV3ForCausalLM", "sglang.srt.models.deepseek_v2", "", True),
        ArchSpec("DeepseekV2ForCausalLM", "sglang.srt.models.deepseek_v2", "", True),
        ArchSpec("KimiK25ForConditionalGeneration", "sglang.srt.models.kimi_k25", "language_model", True),
        ArchSpec("LlamaForCausalLM", "sglang.srt.models.llama", "", False),
        ArchSpec("Qwen2ForCausalLM", "sglang.srt.models.qwen2", "", False),
        ArchSpec("Qwen3ForCausalLM", "sglang.srt.models.qwen3", "", False),
    )
}


def lookup(architecture: str) -> ArchSpec:
    """Return the spec for `architecture`, or raise naming it and the supported ones."""
    try:
        return SUPPORTED[architecture]
    except KeyError:
        raise UnsupportedArchitecture(
            f"architecture {architecture!r} is not supported by the hidden-state capture; "
            f"supported: {', '.join(sorted(SUPPORTED))}"
        ) from None
