"""The draft config's aux layer ids make SGLang capture, at serving, the layers the set was captured from.

The table in hsextract.draft_config (SGLang adds one to every id for Llama and Qwen, and for the
DeepSeek family only when the first id is 1) is checked against SGLang 0.5.23's own
`set_eagle3_layers_to_capture` of every supported architecture, called in a subprocess on a stand-in
model object: an SGLang that changes its numbering fails here, not in a drafter's acceptance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hsextract.archs import SUPPORTED
from hsextract.draft_config import (
    PLUS_ONE_RULES,
    build_draft_config,
    lm_head_key,
    served_capture,
    serving_layer_ids,
)
from hsextract.errors import LayerConfigError

TESTS = Path(__file__).resolve().parents[1]
PROBE = r"""
import importlib, json, sys, types
from hsextract.archs import SUPPORTED
cases = json.loads(sys.argv[1])

def stand_in():
    return types.SimpleNamespace(pp_group=types.SimpleNamespace(is_last_rank=True),
                                 config=types.SimpleNamespace(num_hidden_layers=61), model=types.SimpleNamespace())

out = {}
for arch, ids in cases:
    spec = SUPPORTED[arch]
    cls = getattr(importlib.import_module(spec.sglang_module), arch)
    outer = stand_in()
    target = outer
    if spec.causal_lm_attr:  # Kimi-K2.5 hands the ids to its DeepSeek-V3 language model
        deepseek = importlib.import_module("sglang.srt.models.deepseek_v2").DeepseekV3ForCausalLM
        target = stand_in()
        setattr(outer, spec.causal_lm_attr, types.SimpleNamespace(
            set_eagle3_layers_to_capture=types.MethodType(deepseek.set_eagle3_layers_to_capture, target)))
    cls.set_eagle3_layers_to_capture(outer, ids)
    out[f"{arch} {ids}"] = target.model.layers_to_capture
print(json.dumps(out))
"""
IDS = [[1, 29, 57], [2, 30, 58], [0, 3, 5], [5, 30, 58], [1, 2, 3]]


@pytest.mark.slow
def test_the_rule_of_every_architecture_is_sglangs_own():
    cases = [(arch, ids) for arch in SUPPORTED for ids in IDS]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(TESTS / "stubs"), os.environ.get("PYTHONPATH", "")]),
        SGLANG_USE_CPU_ENGINE="1",
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(cases)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    sglang = json.loads(done.stdout.splitlines()[-1])
    ours = {f"{arch} {ids}": served_capture(arch, ids) for arch, ids in cases}
    assert ours == sglang


def test_every_supported_architecture_has_a_rule():
    assert set(PLUS_ONE_RULES) == set(SUPPORTED)


@pytest.mark.parametrize(
    ("arch", "captured", "ids"),
    [
        ("LlamaForCausalLM", [2, 15, 27], [1, 14, 26]),
        ("LlamaForCausalLM", [1, 4, 6], [0, 3, 5]),
        ("DeepseekV3ForCausalLM", [2, 30, 58], [1, 29, 57]),
        ("DeepseekV3ForCausalLM", [5, 30, 58], [5, 30, 58]),
        ("KimiK25ForConditionalGeneration", [2, 30, 58], [1, 29, 57]),
    ],
)
def test_the_ids_written_make_sglang_capture_the_sets_layers(arch, captured, ids):
    assert serving_layer_ids(arch, captured) == ids
    assert served_capture(arch, ids) == captured


def test_layers_no_draft_config_can_name_are_refused_with_the_reason():
    with pytest.raises(LayerConfigError, match=r"cannot be served.*DeepseekV3ForCausalLM.*first id is 1"):
        serving_layer_ids("DeepseekV3ForCausalLM", [1, 30, 58])


def test_the_draft_config_copies_the_targets_shape_and_clamps_the_draft_vocabulary():
    target = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 49152,
        "hidden_size": 576,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "intermediate_size": 1536,
        "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
        "rms_norm_eps": 1e-5,
        "num_hidden_layers": 30,
        "tie_word_embeddings": True,
    }
    config = build_draft_config(target, "LlamaForCausalLM", [2, 15, 27], 64000)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert (config["hidden_size"], config["head_dim"]) == (576, 64)
    assert config["rope_parameters"] == target["rope_parameters"]
    assert config["draft_vocab_size"] == 49152 and config["tie_word_embeddings"] is False
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]


def test_a_tied_model_names_its_embedding_as_the_head(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.embed_tokens.weight": "a.safetensors", "model.norm.weight": "a.safetensors"}})
    )
    assert lm_head_key(tmp_path) == "model.embed_tokens.weight"
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.embed_tokens.weight": "a.safetensors", "lm_head.weight": "b.safetensors"}})
    )
    assert lm_head_key(tmp_path) == "lm_head.weight"
