"""Model directories that differ from a tiny model only in their tokenizer files: written by
transformers' own ``save_pretrained``, as a real model's files are, so the client loads them the
way it loads a served model's."""

from __future__ import annotations

import fcntl
import json
import shutil
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[1] / "dataset" / "templates"
# template name -> the special tokens the real model's tokenizer has for it ("tiny": the tiny
# model's own template and tokenizer, unchanged)
TEMPLATE_SPECIAL_TOKENS = {
    "tiny": [],
    "llama3": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "deepseek_v3": ["<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"],
    "kimi_k2": ["<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>"],
    "qwen3_thinking": ["<|im_start|>", "<|im_end|>"],
    "qwen3_tools": [
        "<|im_start|>",
        "<|im_end|>",
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
        "<tool_response>",
        "</tool_response>",
    ],
    "readable": [],
}


def template_model(base: Path, template: str) -> Path:
    """A model directory like ``base`` whose tokenizer files carry ``template``
    (tests/dataset/templates) and its special tokens; ``base`` itself for "tiny"."""
    if template == "tiny":
        return base
    out = base.parent / f"{base.name}-tokenizer-{template}"
    return tokenizer_dir(base, out, TEMPLATE_SPECIAL_TOKENS[template], (TEMPLATES / f"{template}.jinja").read_text())


def tokenizer_dir(base: Path, out: Path, special_tokens: list[str] = (), chat_template: str | None = None) -> Path:
    """``base``'s tokenizer with ``special_tokens`` added and ``chat_template`` set, saved in ``out``
    beside ``base``'s config.json; reused when ``out`` already holds that tokenizer."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:  # several pytest processes may write it at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _write(base, out, special_tokens, chat_template)


def _write(base: Path, out: Path, special_tokens: list[str], chat_template: str | None) -> Path:
    from transformers import AutoTokenizer

    stamp = json.dumps({"base": str(base), "special": list(special_tokens), "template": chat_template})
    marker = out / "hsextract-test-tokenizer.json"
    if marker.is_file() and marker.read_text() == stamp:
        return out
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(base))
    if special_tokens:
        tok.add_special_tokens({"additional_special_tokens": list(special_tokens)})
    if chat_template is not None:
        tok.chat_template = chat_template
    tok.save_pretrained(str(out))
    shutil.copy(base / "config.json", out / "config.json")
    marker.write_text(stamp)
    return out
