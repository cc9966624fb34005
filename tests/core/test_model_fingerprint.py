"""A model directory's fingerprint tells apart its weights, its tokenizer and its chat template, and
is the same for the same files at another path."""

from __future__ import annotations

import json
import shutil
import struct

import pytest
from hsextract.model_fingerprint import SMALL_FILE, differing_parts, model_fingerprint


@pytest.fixture
def model(tiny_llama, tmp_path):
    """A copy of the tiny Llama to change."""
    return shutil.copytree(tiny_llama, tmp_path / "model")


def test_the_same_files_at_another_path_have_the_same_fingerprint(tiny_llama, model):
    assert model_fingerprint(model) == model_fingerprint(tiny_llama)
    assert set(model_fingerprint(model)) == {"method", "weights", "tokenizer", "chat_template"}


def test_a_model_of_the_same_config_and_other_weights_differs_in_its_weights_only(tiny_llama, tiny_llama_seed2):
    assert (tiny_llama / "config.json").read_bytes() == (tiny_llama_seed2 / "config.json").read_bytes()
    assert differing_parts(model_fingerprint(tiny_llama), model_fingerprint(tiny_llama_seed2)) == ["weights"]


def test_another_chat_template_differs_in_the_chat_template_only(tiny_llama, model):
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert differing_parts(model_fingerprint(tiny_llama), model_fingerprint(model)) == ["chat_template"]


def test_a_chat_template_inside_tokenizer_config_is_the_chat_templates_part_not_the_tokenizers(tiny_llama, model):
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{{ messages }}"}))
    assert differing_parts(model_fingerprint(tiny_llama), model_fingerprint(model)) == ["chat_template"]


def test_another_tokenizer_differs_in_the_tokenizer_only(tiny_llama, model):
    tok = json.loads((model / "tokenizer.json").read_text())
    tok["added_tokens"].append({**tok["added_tokens"][-1], "id": 319, "content": "<|tool|>"})
    (model / "tokenizer.json").write_text(json.dumps(tok))
    assert differing_parts(model_fingerprint(tiny_llama), model_fingerprint(model)) == ["tokenizer"]


def test_files_that_are_neither_weights_tokenizer_nor_template_do_not_count(tiny_llama, model):
    (model / "README.md").write_text("a model card")
    (model / "generation_config.json").write_text("{}")
    assert model_fingerprint(model) == model_fingerprint(tiny_llama)


def test_a_model_given_by_name_has_no_fingerprint(tmp_path):
    assert model_fingerprint("meta-llama/Llama-3.1-8B-Instruct") == {}
    assert model_fingerprint("") == {}


def _big_safetensors(path, fill: bytes) -> None:
    """A safetensors file of SMALL_FILE bytes of data: one tensor whose every byte is `fill`."""
    raw = json.dumps({"w": {"dtype": "BF16", "shape": [SMALL_FILE // 2], "data_offsets": [0, SMALL_FILE]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.write(fill * SMALL_FILE)


def test_a_large_weight_file_of_other_values_in_the_same_shapes_differs(tmp_path):
    """Beyond SMALL_FILE a file is known by its header and blocks spread over its data: a checkpoint
    of the same shapes (equal headers, equal sizes) differs in them."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _big_safetensors(a / "model.safetensors", b"\x01")
    _big_safetensors(b / "model.safetensors", b"\x02")
    assert (a / "model.safetensors").stat().st_size == (b / "model.safetensors").stat().st_size
    assert differing_parts(model_fingerprint(a), model_fingerprint(b)) == ["weights"]
    (b / "model.safetensors").unlink()
    _big_safetensors(b / "model.safetensors", b"\x01")
    assert model_fingerprint(a) == model_fingerprint(b)
