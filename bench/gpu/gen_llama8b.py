"""Write a random-weight model of Llama-3-8B's shape (bf16, 16 GB) for the server-level capture bench.

No model can be downloaded on the GPU test machine, and the bench needs the real per-token cost
of an 8B forward pass, not real text: the weights are drawn on the GPU (normal, std 0.02; norms
1), in four safetensors shards of 8 layers, and the tokenizer is copied from a tiny model (the
capture bench sends token ids). About 30 s on an H200 host.

The tokenizer is a word-level one over the whole vocabulary (``w0`` ... ``w128248`` and the tiny
model's special tokens, with its chat template): whatever token the random model generates decodes
to a word that encodes back to the same id. Regeneration's bench needs that: each turn re-sends the
replies before it as text, and the radix cache reuses their KV only if the text gives back the
same tokens (a reply the tiny tokenizer cannot spell would come back empty).

    python3 bench/gpu/gen_llama8b.py OUT_DIR --tokenizer-from TINY_LLAMA_DIR [--layers 32]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "files" / "python"))

HIDDEN, INTERMEDIATE, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 4096, 14336, 128256, 32, 8, 128
LAYERS_PER_SHARD = 8
# Long enough for the pipeline check's near-context samples (16K-32K tokens; bench/gpu/pipeline_gpu.py).
MAX_POSITIONS = 32768


def write_config(out: Path, tokenizer_from: Path, layers: int) -> None:
    cfg = json.loads((tokenizer_from / "config.json").read_text())
    cfg.update(
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        vocab_size=VOCAB,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        torch_dtype="bfloat16",
        tie_word_embeddings=False,
    )
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    write_word_tokenizer(out, tokenizer_from, VOCAB)


def word(i: int) -> str:
    """The word of token id ``i`` past the special tokens."""
    return f"w{i}"


def write_word_tokenizer(out: Path, tokenizer_from: Path, vocab_size: int) -> None:
    """A word-level tokenizer of ``vocab_size`` ids that round-trips every id: the tiny model's
    special tokens first (same ids, same chat template), then one word per remaining id."""
    from hsextract.tiny_model import CHAT_TEMPLATE, ROLE_TOKENS
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    added = json.loads((tokenizer_from / "tokenizer.json").read_text())["added_tokens"]
    specials = [t["content"] for t in sorted(added, key=lambda t: t["id"])]
    if [t["id"] for t in added] != list(range(len(added))):
        raise ValueError(f"{tokenizer_from}: the special tokens are not ids 0..{len(added) - 1}")
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({word(i): i for i in range(len(specials), vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=ROLE_TOKENS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    if (tokenizer_from / "generation_config.json").is_file():
        shutil.copy(tokenizer_from / "generation_config.json", out / "generation_config.json")


def generate(out: str | Path, tokenizer_from: str | Path, layers: int = 32, seed: int = 0) -> Path:
    out, tokenizer_from = Path(out), Path(tokenizer_from)
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, tokenizer_from, layers)
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda", generator=gen) * 0.02).to(torch.bfloat16).cpu()

    def ones() -> torch.Tensor:
        return torch.ones(HIDDEN, dtype=torch.bfloat16)

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    weight_map: dict[str, str] = {}
    total = 0
    for first in range(0, layers, LAYERS_PER_SHARD):
        tensors = {"model.embed_tokens.weight": rand(VOCAB, HIDDEN)} if first == 0 else {}
        for i in range(first, min(layers, first + LAYERS_PER_SHARD)):
            p = f"model.layers.{i}."
            tensors.update(
                {
                    p + "self_attn.q_proj.weight": rand(q, HIDDEN),
                    p + "self_attn.k_proj.weight": rand(kv, HIDDEN),
                    p + "self_attn.v_proj.weight": rand(kv, HIDDEN),
                    p + "self_attn.o_proj.weight": rand(HIDDEN, q),
                    p + "mlp.gate_proj.weight": rand(INTERMEDIATE, HIDDEN),
                    p + "mlp.up_proj.weight": rand(INTERMEDIATE, HIDDEN),
                    p + "mlp.down_proj.weight": rand(HIDDEN, INTERMEDIATE),
                    p + "input_layernorm.weight": ones(),
                    p + "post_attention_layernorm.weight": ones(),
                }
            )
        if first + LAYERS_PER_SHARD >= layers:
            tensors.update({"model.norm.weight": ones(), "lm_head.weight": rand(VOCAB, HIDDEN)})
        shard = f"model-{first // LAYERS_PER_SHARD:05d}.safetensors"
        save_file(tensors, str(out / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    # transformers finds the shards through their index (SGLang globs them); the GPU tier compares a
    # few samples with transformers.
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    (out / "hsextract-llama8b.json").write_text(json.dumps({"layers": layers, "seed": seed}))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--tokenizer-from", required=True, help="a tiny Llama directory (config and tokenizer)")
    ap.add_argument("--layers", type=int, default=32)
    args = ap.parse_args()
    generate(args.out, args.tokenizer_from, args.layers)
    print(json.dumps({"path": args.out, "layers": args.layers}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
