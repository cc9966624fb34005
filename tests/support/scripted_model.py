"""A tiny Llama whose greedy reply is a script: it thinks, calls a tool, and ends its turn, for real.

A random-weight model never writes ``<think>`` or ``<tool_call>``, so SGLang's reasoning and
tool-call parsers would never see anything to parse. This model is built so that its next token
depends only on the current one: every layer's output projections are zero (the residual stream
is the token's embedding), the embeddings of the script's tokens are one-hot, and the output
head maps each of them to its successor with a wide margin. Whole strings of the script
(``<think>...</think>``, ``<tool_call>...</tool_call>``) are single added tokens, so a chain of a
few tokens writes them exactly. Any other token is followed by random text, as in the tiny models.

The served model is real in every other way: SGLang loads it, applies its chat template (a
Qwen3-style one), runs the forward pass, and its parsers split the reply.
"""

from __future__ import annotations

import json
from pathlib import Path

THINK = "<think>\nLet me check the weather.\n</think>\n\n"
NO_THINK = "<think>\n\n</think>\n\n"  # what the template puts in the prompt with enable_thinking=false
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
END = "<|im_end|>"
# current token -> next token: after the assistant header ("\n") the model thinks, then calls the
# tool, then ends its turn; with thinking switched off it calls the tool at once.
SCRIPT = {"\n": THINK, THINK: CALL, CALL: END, NO_THINK: CALL}
REASONING = "Let me check the weather."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def make_scripted_model(base: Path, out: Path, template: str, script: dict[str, str] = SCRIPT, seed: int = 0) -> Path:
    """Write the scripted model to `out` from the tiny Llama at `base`; idempotent."""
    import torch
    from tokenizers import AddedToken
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    marker = out / "hsextract-scripted.json"
    stamp = {"script": script, "template": template, "seed": seed}
    if marker.exists() and json.loads(marker.read_text()) == stamp:
        return out
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(base))
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", END]})
    words = sorted({w for pair in script.items() for w in pair} - {END, "\n"})
    tok.add_tokens([AddedToken(w, normalized=False, special=False) for w in words])
    tok.eos_token = END
    tok.chat_template = template

    def one(text: str) -> int:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, f"{text!r} is {len(ids)} tokens"
        return ids[0]

    cfg = LlamaConfig(
        **{
            **json.loads((base / "config.json").read_text()),
            "vocab_size": len(tok),
            "eos_token_id": one(END),
            "torch_dtype": "bfloat16",
        }
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb, head = model.model.embed_tokens.weight, model.lm_head.weight
        head.mul_(8.0)
        dims = {one(a): k for k, a in enumerate(script)}
        emb[:, list(dims.values())] = 0.0
        head[:, list(dims.values())] = 0.0
        for a, b in script.items():
            k = dims[one(a)]
            emb[one(a)] = 0.0
            emb[one(a), k] = 1.0  # after the final norm: sqrt(hidden) on dimension k, 0 elsewhere
            head[one(b), k] = 20.0
    model.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": one(END), "bos_token_id": 1}))
    marker.write_text(json.dumps(stamp))
    return out
