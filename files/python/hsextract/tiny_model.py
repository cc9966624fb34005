"""Generate tiny random-weight models (Llama and DeepSeek-V3) with a working tokenizer and chat template.

Tests and the local demo run the real SGLang server on CPU; no model can be downloaded, so the
project builds its own. The DeepSeek-V3 model carries the config keys SGLang 0.5.23 needs on CPU
(``topk_method: noaux_tc``, ``scoring_func: sigmoid`` and yarn rope parameters) and exercises
MLA and MoE. ``dsv3-gpu`` is the same model with DeepSeek's own MLA head dims (kv_lora_rank 512,
rope 64, nope 128, v 128): Triton's MLA decode kernel on the GPU does not compile for the CPU
model's tiny ones (``Cannot make_shape_compatible: 32 and 64``). ``dsv3-gpu8`` has 8 attention heads
and wider MLPs, so that every tensor-parallel split of 8 GPUs is whole. Generation is deterministic
(fixed seeds), so a model directory is reproducible.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

KINDS = ("llama", "dsv3", "dsv3-gpu", "dsv3-gpu8")
NUM_LAYERS = 8  # enough for the EAGLE-3 default aux layers [1, L//2-1, L-4] = [1, 3, 4]
HIDDEN = 64
VOCAB = 320
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
# The tiny model's own chat template: role tokens, content, end-of-turn token.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_CORPUS = [
    "The capital city of France is Paris.",
    "Hello world, this is a tiny test model for sglang.",
    "Deep learning models produce hidden states at every layer.",
    "We dump auxiliary hidden states during prefill to shared memory.",
    "A quick brown fox jumps over the lazy dog.",
    "User asks a question and the assistant answers it politely.",
    "Speculative decoding drafts tokens that the target model verifies.",
]


def make_tokenizer(path: Path):
    """Train a small byte-level BPE tokenizer and save it with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>", *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=ROLE_TOKENS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))
    return fast


def _llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
    )


# The MLA head dims of DeepSeek-V3 itself, which the GPU attention kernels are written for.
_DSV3_GPU_MLA = {
    "kv_lora_rank": 512,
    "q_lora_rank": 96,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
}


# DeepSeek-V3 split 8 ways: 8 attention heads, and MLP widths that stay whole (and a multiple of 8)
# on each of 8 ranks.
_DSV3_TP8 = {"num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 512, "moe_intermediate_size": 128}


def _dsv3_config(mla: dict[str, int] | None = None, shape: dict[str, int] | None = None):
    from transformers import DeepseekV3Config

    dims = {"kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16}
    dims.update(mla or {})
    # A plain dict: transformers' stubs do not know every DeepSeek field (moe_layer_freq).
    fields: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        moe_layer_freq=1,
        max_position_embeddings=2048,
        **dims,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 512,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    )
    fields.update(shape or {})
    return DeepseekV3Config(**fields)


# Keys SGLang 0.5.23 reads from a DeepSeek-V3 config that transformers 5.x no longer writes.
_DSV3_SGLANG_KEYS = {
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "aux_loss_alpha": 0.001,
    "seq_aux": True,
    "ep_size": 1,
    "num_nextn_predict_layers": 0,
}


def model_config(kind: str):
    """The transformers config of a tiny model of `kind`."""
    if kind == "llama":
        return _llama_config()
    if kind == "dsv3":
        return _dsv3_config()
    return _dsv3_config(_DSV3_GPU_MLA, _DSV3_TP8 if kind == "dsv3-gpu8" else None)


def make_tiny_model(kind: str, path: str | Path, seed: int = 0) -> Path:
    """Write a tiny random-weight model of `kind` (one of KINDS) to `path`; return the path."""
    import torch
    from transformers import AutoModelForCausalLM

    if kind not in KINDS:
        raise ValueError(f"unknown tiny model kind {kind!r}; expected one of {KINDS}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = model_config(kind)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    # Random init gives near-uniform logits; widen them so greedy decoding is well separated.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(str(out), safe_serialization=True)
    make_tokenizer(out)
    cfg_path = out / "config.json"
    data = json.loads(cfg_path.read_text())
    data["torch_dtype"] = "bfloat16"
    if kind.startswith("dsv3"):
        data.update(_DSV3_SGLANG_KEYS)
        data["rope_scaling"] = data.get("rope_parameters")
    cfg_path.write_text(json.dumps(data, indent=2, sort_keys=True))
    (out / "hsextract-tiny.json").write_text(json.dumps({"kind": kind, "seed": seed}))
    return out


def ensure_tiny_model(kind: str, path: str | Path, seed: int = 0) -> Path:
    """Generate the model unless a complete one is already at `path` (idempotent, for Ansible)."""
    out = Path(path)
    marker = out / "hsextract-tiny.json"
    if marker.exists() and json.loads(marker.read_text()) == {"kind": kind, "seed": seed}:
        return out
    return make_tiny_model(kind, out, seed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=KINDS, default="llama")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="regenerate even if the model exists")
    parser.add_argument("path", help="model directory to write")


def run(args: argparse.Namespace) -> int:
    marker = Path(args.path) / "hsextract-tiny.json"
    existed = marker.exists()
    make = make_tiny_model if args.force else ensure_tiny_model
    out = make(args.kind, args.path, args.seed)
    print(json.dumps({"path": str(out), "kind": args.kind, "changed": args.force or not existed}))
    return 0
