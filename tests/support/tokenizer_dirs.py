"""Model directories that differ from a tiny model only in their tokenizer files: written by
transformers' own ``save_pretrained``, as a real model's files are, so the client loads them the
way it loads a served model's."""

from __future__ import annotations

import fcntl
import json
import shutil
from pathlib import Path


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
