"""Model facts come from config.json; unsupported architectures are named with the supported list."""

from __future__ import annotations

import json

import pytest
from hsextract.archs import SUPPORTED, lookup
from hsextract.errors import ConfigError, UnsupportedArchitecture
from hsextract.model_info import read_model_info


def test_kimi_style_text_config_supplies_layers_and_hidden_size(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["KimiK25ForConditionalGeneration"],
                "text_config": {"num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840},
            }
        )
    )
    info = read_model_info(tmp_path)
    assert info.architecture == "KimiK25ForConditionalGeneration"
    assert (info.num_hidden_layers, info.hidden_size) == (61, 7168)


def test_missing_config_names_the_model_path(tmp_path):
    with pytest.raises(ConfigError, match=f"{tmp_path}: no config.json"):
        read_model_info(tmp_path)


def test_unknown_architecture_lists_the_supported_ones():
    with pytest.raises(UnsupportedArchitecture) as err:
        lookup("MistralForCausalLM")
    assert "MistralForCausalLM" in str(err.value)
    for name in SUPPORTED:
        assert name in str(err.value)
