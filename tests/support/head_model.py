"""A model directory with what the drain reads of a model and what its self-check reads (config,
``lm_head``, final norm), for dumps staged without a server (support.staged_dumps): the head of any
vocabulary size, so that a pass of the self-check over it can be made as slow as a test needs.

`logits` gives the token the server would have sampled from a final hidden state: what a sound
dump's done marker records, and what the drain's self-check must find again.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from support.staged_dumps import EAGLE_IDS, HIDDEN

LAYERS = 8  # the depth whose default aux layers are the staged dumps' EAGLE_IDS ([1, L//2-1, L-4])


def write_head_model(
    path: Path, vocab: int, hidden: int = HIDDEN, seed: int = 0, norm: torch.Tensor | None = None
) -> torch.Tensor:
    """Write the model directory; return its head ``[vocab, hidden]`` (bf16). Its final norm is all
    ones, so a post-norm row and its pre-norm form differ only by the RMS normalisation, unless
    `norm` gives its weight."""
    assert hidden == HIDDEN and len(EAGLE_IDS) == 3, "the staged dumps' shape"
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 4 * hidden,
        "vocab_size": vocab,
        "torch_dtype": "bfloat16",
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }
    (path / "config.json").write_text(json.dumps(config))
    head = torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    weight = torch.ones(hidden) if norm is None else norm
    save_file(
        {"lm_head.weight": head, "model.norm.weight": weight.to(torch.bfloat16)},
        str(path / "model.safetensors"),
    )
    return head


def logits(head: torch.Tensor, final_rows: torch.Tensor) -> torch.Tensor:
    """The float32 logits ``[n, vocab]`` of post-norm final rows ``[n, H]`` through ``head``, a
    slice of the head at a time: its argmax is the server's greedy token, its argmin a token the
    self-check must refuse."""
    rows = final_rows.float().T
    return torch.cat([head[a : a + (1 << 18)].float() @ rows for a in range(0, head.shape[0], 1 << 18)]).T
