"""What ``--to-bf16`` may make of an FP8 set (hsextract.formats.to_bf16.bf16_conversion): refused,
before any file is converted, where the new format's final state cannot be computed from the set's
or would come from another model's norm."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hsextract.errors import ConfigError
from hsextract.formats.to_bf16 import bf16_conversion
from hsextract.model_fingerprint import model_fingerprint
from hsextract.output.manifest import ManifestHeader
from support.head_model import write_head_model
from support.staged_dumps import EAGLE_IDS, HIDDEN

FP8_SET = ManifestHeader(
    format="speculators",
    final_hidden="pre_norm",
    dtype="bfloat16",
    hidden_size=HIDDEN,
    num_aux=len(EAGLE_IDS),
    eagle_aux_hidden_state_layer_ids=EAGLE_IDS,
    sglang_layers_to_capture=[i + 1 for i in EAGLE_IDS],
    num_hidden_layers=8,
    precision="fp8",
)


def test_the_sets_own_format_needs_no_model_and_keeps_its_final_state():
    conversion = bf16_conversion(FP8_SET)
    assert (conversion.header.format, conversion.header.final_hidden) == ("speculators", "pre_norm")
    assert (conversion.header.precision, conversion.header.dtype) == ("bf16", "bfloat16")
    assert conversion.final_norm is None and not conversion.reformats


def test_speculators_v1_holds_the_pre_norm_state_so_needs_no_model():
    conversion = bf16_conversion(FP8_SET, "speculators-v1")
    assert conversion.reformats and conversion.final_norm is None
    assert conversion.header.format == "speculators-v1"


def test_a_post_norm_format_without_the_model_is_refused_naming_the_flag():
    with pytest.raises(ConfigError, match="give --model, the set's model directory"):
        bf16_conversion(FP8_SET, "specforge")


def test_a_post_norm_format_reads_the_final_norm_of_the_model(tmp_path):
    weight = torch.linspace(0.5, 1.5, HIDDEN)
    write_head_model(tmp_path, vocab=100, norm=weight)
    conversion = bf16_conversion(FP8_SET, "modelopt", tmp_path)
    assert conversion.header.final_hidden == "post_norm"
    assert torch.equal(conversion.final_norm.weight, weight.to(torch.bfloat16).float())
    assert str(tmp_path) in conversion.header.extra["converted_from"]


def test_a_model_of_another_width_is_refused(tmp_path):
    write_head_model(tmp_path, vocab=100)
    with pytest.raises(ConfigError, match=f"final norm has {HIDDEN} weights, the set's hidden size is 128"):
        bf16_conversion(replace(FP8_SET, hidden_size=128), "specforge", tmp_path)


def test_a_model_whose_weights_are_not_the_recorded_ones_is_refused(tmp_path):
    write_head_model(tmp_path / "captured", vocab=100, seed=1)
    write_head_model(tmp_path / "other", vocab=100, seed=2)
    header = replace(FP8_SET, model_fingerprint=model_fingerprint(tmp_path / "captured"))
    assert bf16_conversion(header, "specforge", tmp_path / "captured").final_norm is not None
    with pytest.raises(ConfigError, match="its weights are not those of the model the set was captured from"):
        bf16_conversion(header, "specforge", tmp_path / "other")


def test_a_pre_norm_state_cannot_be_made_of_a_post_norm_one():
    with pytest.raises(ConfigError, match="cannot be computed from it"):
        bf16_conversion(replace(FP8_SET, final_hidden="post_norm"), "speculators-v1")
