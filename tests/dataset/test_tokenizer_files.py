"""The client loads the model's tokenizer without transformers where AutoTokenizer would build the
generic fast tokenizer anyway, and through AutoTokenizer otherwise (the direct tokenizer's own
equivalence with transformers: tests/dataset/test_direct_tokenizer.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hsextract.dataset.chat_template import load_tokenizer
from hsextract.dataset.direct_tokenizer import DirectTokenizer
from hsextract.dataset.tokenizer_files import GENERIC_FAST_CLASSES, GENERIC_MODEL_TYPES, generic_fast_tokenizer
from transformers import AutoTokenizer


def _tokenizer_copy(src: Path, dst: Path, model_type: str | None = None, **config) -> Path:
    """The tokenizer files of ``src`` in ``dst``, with ``config`` over its tokenizer_config.json
    and ``model_type`` in its config.json."""
    dst.mkdir()
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "config.json",
        "chat_template.jinja",
    ):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    (dst / "tokenizer_config.json").write_text(json.dumps({**cfg, **config}))
    if model_type is not None:
        model_cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**model_cfg, "model_type": model_type}))
    return dst


def test_the_generic_fast_tokenizer_loads_without_importing_transformers(tiny_llama):
    probe = (
        "import sys; from hsextract.dataset.chat_template import load_tokenizer; "
        f"tok = load_tokenizer({str(tiny_llama)!r}); "
        "print(type(tok).__name__, 'transformers' in sys.modules, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == ["DirectTokenizer", "False", "False"], (
        f"the tokenizer was loaded through transformers or torch: {done.stdout}"
    )


@pytest.mark.parametrize("model_type", sorted(GENERIC_MODEL_TYPES))
@pytest.mark.parametrize("named", ["PreTrainedTokenizerFast", "TokenizersBackend"])
def test_auto_tokenizer_builds_the_generic_class_for_every_type_taken_directly(tiny_llama, tmp_path, model_type, named):
    """The direct path's premise, checked against the installed transformers: for these model
    types AutoTokenizer keeps the generic class the files name."""
    model = _tokenizer_copy(tiny_llama, tmp_path / model_type, model_type=model_type, tokenizer_class=named)
    assert generic_fast_tokenizer(model)
    assert type(AutoTokenizer.from_pretrained(str(model))).__name__ in GENERIC_FAST_CLASSES
    assert isinstance(load_tokenizer(model), DirectTokenizer)


def test_a_model_type_whose_class_auto_tokenizer_overrides_goes_through_auto_tokenizer(tiny_llama, tmp_path):
    # Qwen2: AutoTokenizer replaces a generic class named by the hub with Qwen2's own
    model = _tokenizer_copy(tiny_llama, tmp_path / "qwen2", model_type="qwen2")
    assert not generic_fast_tokenizer(model)
    tok = load_tokenizer(model)
    assert type(tok).__name__ not in ("TokenizersBackend", "PreTrainedTokenizerFast")
    assert type(tok) is type(AutoTokenizer.from_pretrained(str(model)))


def test_a_tokenizer_of_its_own_class_goes_through_auto_tokenizer(tiny_llama, tmp_path):
    model = _tokenizer_copy(tiny_llama, tmp_path / "llama-class", tokenizer_class="LlamaTokenizerFast")
    assert not generic_fast_tokenizer(model)
    tok = load_tokenizer(model)
    assert type(tok).__name__.startswith("LlamaTokenizer")  # Llama's own class, as AutoTokenizer resolves it
    assert type(tok) is type(AutoTokenizer.from_pretrained(str(model)))


def test_custom_tokenizer_code_or_missing_files_are_never_taken_for_the_generic_one(tiny_llama, tmp_path):
    custom = _tokenizer_copy(
        tiny_llama, tmp_path / "custom", auto_map={"AutoTokenizer": ["tok.TikTokenTokenizer", None]}
    )
    assert not generic_fast_tokenizer(custom)
    no_json = _tokenizer_copy(tiny_llama, tmp_path / "no-json")
    (no_json / "tokenizer.json").unlink()
    assert not generic_fast_tokenizer(no_json)
    assert not generic_fast_tokenizer(tmp_path / "nowhere")
    assert generic_fast_tokenizer(tiny_llama)
