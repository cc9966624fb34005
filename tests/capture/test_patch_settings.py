"""What ``hsextract capture-patch`` renders, from its flags and a run configuration file: its options
are declared once, as the fields of `PatchSettings` and of the capture's own `CaptureConfig`
(hsextract.options), and each command line below gives, field by field, the settings the command
built when every option was spelled three times (a flag, a field, the line between them)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from hsextract.capture.config import CaptureConfig
from hsextract.capture.patch import DEFAULT_ANSIBLE_MANAGED, PatchSettings, add_arguments, settings_from
from hsextract.config_file import apply_config
from hsextract.errors import ConfigError


@pytest.fixture
def model(tmp_path) -> Path:
    """A model directory whose config.json names its architecture (all the settings read of it)."""
    path = tmp_path / "model"
    path.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4, "hidden_size": 64}
    (path / "config.json").write_text(json.dumps(config))
    return path


def _settings(*argv: str) -> PatchSettings:
    parser = argparse.ArgumentParser(prog="hsextract capture-patch")
    add_arguments(parser)
    return settings_from(apply_config(parser, parser.parse_args(argv), argv))


def test_out_dir_model_and_dump_dir_alone_render_the_models_architecture_at_every_default(model):
    assert _settings("--out-dir", "/o", "--model", str(model), "--dump-dir", "/d") == PatchSettings(
        out_dir=Path("/o"),
        capture=CaptureConfig(
            model_path=str(model),
            architecture="LlamaForCausalLM",
            aux_layer_ids=None,
            layer_convention="eagle",
            dump_dir="/d",
            rid_prefix="hsx",
            format="",
            final_hidden="post_norm",
            writer_process=True,
        ),
        package_name="hsextract_capture_patch",
        ansible_managed=DEFAULT_ANSIBLE_MANAGED,
        device="cuda",
    )


def test_every_flag_given_in_its_older_spelling_is_the_setting_it_names(model):
    settings = _settings(
        "--out-dir", "/o", "--model-path", str(model), "--dump-dir", "/d", "--aux-layer-ids", "1,2",
        "--layer-convention", "sglang", "--rid-prefix", "r1", "--format", "speculators", "--no-writer-process",
        "--package-name", "pkg2", "--ansible-managed", "hi", "--device", "cpu",
    )  # fmt: skip
    assert settings == PatchSettings(
        out_dir=Path("/o"),
        capture=CaptureConfig(
            model_path=str(model),
            architecture="LlamaForCausalLM",
            aux_layer_ids=[1, 2],
            layer_convention="sglang",
            dump_dir="/d",
            rid_prefix="r1",
            format="speculators",
            final_hidden="pre_norm",  # what the format needs
            writer_process=False,
        ),
        package_name="pkg2",
        ansible_managed="hi",
        device="cpu",
    )


def test_the_run_configurations_keys_are_the_flags_and_a_flag_given_wins(tmp_path, model):
    run = {
        "model": str(model),
        "dump_dir": "/dev/shm/hsx",
        "aux_layers": [1, 2],
        "final_hidden": "pre_norm",
        "layer_convention": "sglang",
        "architecture": "LlamaForCausalLM",
        "ansible_managed": "by the play",
        "writer_process": False,
        "package_name": "pkg_c",
        "rid_prefix": "shared",
        "device": "cpu",
        "out_dir": "/from-the-file",
        "dataset": "/another-subcommands-key.jsonl",
    }
    (tmp_path / "run.json").write_text(json.dumps(run))
    settings = _settings("--config", str(tmp_path / "run.json"), "--out-dir", "/o", "--rid-prefix", "cli")
    assert settings == PatchSettings(
        out_dir=Path("/o"),
        capture=CaptureConfig(
            model_path=str(model),
            architecture="LlamaForCausalLM",
            aux_layer_ids=[1, 2],
            layer_convention="sglang",
            dump_dir="/dev/shm/hsx",
            rid_prefix="cli",
            format="",
            final_hidden="pre_norm",
            writer_process=False,
        ),
        package_name="pkg_c",
        ansible_managed="by the play",
        device="cpu",
    )


def test_a_final_norm_placement_the_format_cannot_use_is_refused_naming_the_flag(model):
    with pytest.raises(ConfigError, match="--final-hidden 'pre_norm' does not fit the format 'specforge'"):
        _settings("--out-dir", "/o", "--model", str(model), "--dump-dir", "/d", "--format", "specforge",
                  "--final-hidden", "pre_norm")  # fmt: skip


def test_the_flags_a_patch_needs_are_named_when_missing():
    with pytest.raises(ConfigError, match=r"capture-patch: missing --out-dir, --model$"):
        _settings("--dump-dir", "/d")
