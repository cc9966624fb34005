"""The capture patch package: rendered from the templates, wired to hsextract, nothing else."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hsextract.archs import SUPPORTED
from hsextract.capture.config import CaptureConfig
from hsextract.capture.patch import comment_filter, render_patch, server_launch
from hsextract.capture.sglang_hook import load_base_class, load_base_class_or_refusal
from hsextract.errors import ConfigError, UnsupportedArchitecture

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LLAMA = {"architecture": "LlamaForCausalLM", "model_path": "/m", "dump_dir": "/d"}


def test_rendered_package_subclasses_the_architecture_and_carries_the_config(tmp_path, tiny_llama):
    capture = CaptureConfig(
        architecture="LlamaForCausalLM",
        model_path=str(tiny_llama),
        aux_layer_ids=[1, 2],
        dump_dir="/dev/shm/x",
        rid_prefix="run7",
        final_hidden="pre_norm",
    )
    out = render_patch(tmp_path, capture, ansible_managed="Ansible managed: do not edit")
    pkg = out / "hsextract_capture_patch"
    init = (pkg / "__init__.py").read_text()
    model = (pkg / "model.py").read_text()
    assert init.startswith("#\n# Ansible managed: do not edit\n#\n")
    assert model.startswith("#\n# Ansible managed: do not edit\n#\n")
    namespace: dict = {}
    exec(compile(init, str(pkg / "__init__.py"), "exec"), namespace)
    config = namespace["CONFIG"]
    assert config["aux_layer_ids"] == [1, 2] and config["rid_prefix"] == "run7"
    assert config["final_hidden"] == "pre_norm" and config["dump_dir"] == "/dev/shm/x"
    assert "class LlamaForCausalLM(_Base):" in model and "EntryClass = LlamaForCausalLM" in model
    assert "install(self, CONFIG)" in model


def test_config_survives_awkward_characters(tmp_path):
    odd = '/dev/shm/it\'s "quoted" <&> \\ ünï'
    out = render_patch(
        tmp_path, CaptureConfig(architecture="LlamaForCausalLM", model_path="/nonexistent", dump_dir=odd)
    )
    namespace: dict = {}
    exec((out / "hsextract_capture_patch" / "__init__.py").read_text(), namespace)
    assert namespace["CONFIG"]["dump_dir"] == odd


def test_patch_for_another_architecture_than_the_models_is_refused(tmp_path, tiny_llama):
    with pytest.raises(ConfigError, match="is a 'LlamaForCausalLM'"):
        render_patch(
            tmp_path, CaptureConfig(architecture="Qwen3ForCausalLM", model_path=str(tiny_llama), dump_dir="/dev/shm/x")
        )


def test_architecture_must_be_a_class_name(tmp_path):
    with pytest.raises(ConfigError, match="not a Python class name"):
        render_patch(tmp_path, CaptureConfig(architecture="Llama; import os", model_path="/nonexistent", dump_dir="/d"))


def test_comment_filter_matches_ansibles_default_style():
    assert comment_filter("a\nb") == "#\n# a\n# b\n#"


def test_server_launch_switches_the_capture_on_with_the_flags_it_needs(tmp_path):
    gpu = server_launch(tmp_path, device="cuda")
    assert gpu.env["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "hsextract_capture_patch"
    assert gpu.env["PYTHONPATH"].endswith(str(tmp_path))
    assert {"--disable-radix-cache", "--skip-server-warmup", "--disable-prefill-cuda-graph"} <= set(gpu.args)
    cpu = server_launch(tmp_path, device="cpu")
    assert cpu.env["SGLANG_USE_CPU_ENGINE"] == "1" and "torch_native" in cpu.args


def test_capture_patch_command_renders_and_prints_the_launch_settings(tmp_path, tiny_dsv3):
    env = {"PYTHONPATH": str(REPO / "files" / "python")}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hsextract",
            "capture-patch",
            "--out-dir",
            str(tmp_path),
            "--model",
            str(tiny_dsv3),
            "--dump-dir",
            "/dev/shm/hsx",
            "--aux-layers",
            "1,3,4",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["architecture"] == "DeepseekV3ForCausalLM"
    assert "--disable-radix-cache" in out["server_args"]
    assert (tmp_path / "hsextract_capture_patch" / "model.py").is_file()


def test_unsupported_architecture_gives_a_class_that_refuses_to_build():
    cls = load_base_class_or_refusal("MistralForCausalLM")
    with pytest.raises(UnsupportedArchitecture, match=r"'MistralForCausalLM' is not supported.*LlamaForCausalLM"):
        cls()


def test_the_refusal_says_when_the_other_settings_could_not_be_checked():
    """Outside a SGLang server there are no server arguments to check the rest against: the refusal
    still names the architecture, and says what it left unchecked rather than passing it over."""
    config = {"architecture": "MistralForCausalLM", "model_path": "/m", "dump_dir": "/d", "aux_layer_ids": [1, 3, 7]}
    cls = load_base_class_or_refusal("MistralForCausalLM", config)
    with pytest.raises(UnsupportedArchitecture) as info:
        cls(config=None)
    assert "'MistralForCausalLM' is not supported" in str(info.value)
    assert " AND (the other settings were not checked: " in str(info.value)


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_supported_architectures_resolve_to_sglang_classes_with_the_capture_hooks(name):
    """Guards the attribute paths the adapter relies on against SGLang changes."""
    spec = SUPPORTED[name]
    cls = load_base_class(name)
    assert cls.__name__ == name
    assert hasattr(cls, "set_eagle3_layers_to_capture")
    if spec.causal_lm_attr:  # Kimi-K2.5: the text model is a DeepseekV3ForCausalLM under language_model
        src = inspect.getsource(cls.__init__)
        assert f"self.{spec.causal_lm_attr} = DeepseekV3ForCausalLM(" in src
        return
    forward = inspect.getsource(cls.forward)
    assert "capture_aux_hidden_states" in forward
    module = importlib.import_module(spec.sglang_module)
    inner = [
        c
        for n, c in vars(module).items()
        if inspect.isclass(c)
        and n.endswith("Model")
        and c.__module__ == module.__name__
        and "layers_to_capture" in inspect.getsource(c)
    ]
    assert inner, f"no decoder class with layers_to_capture in {spec.sglang_module}"


def test_config_values_rendered_as_text_are_normalised():
    cfg = CaptureConfig.from_dict(
        {
            "architecture": "LlamaForCausalLM",
            "model_path": "/m",
            "dump_dir": "/d",
            "aux_layer_ids": "[1, 29, 57]",
            "writer_threads": "0",
            "max_bytes_in_flight": "1073741824",
        }
    )
    assert cfg.aux_layer_ids == [1, 29, 57] and cfg.writer_threads == 0 and cfg.max_bytes_in_flight == 1 << 30
    assert CaptureConfig(**LLAMA, aux_layer_ids="None").aux_layer_ids is None
    with pytest.raises(ConfigError, match="final_hidden='middle'"):
        CaptureConfig(**LLAMA, final_hidden="middle")


def test_capture_patch_reads_the_same_run_config_keys_as_the_other_subcommands(tmp_path, tiny_llama):
    config = tmp_path / "run.json"
    config.write_text(
        json.dumps(
            {
                "model": str(tiny_llama),
                "dump_dir": "/dev/shm/hsx",
                "aux_layers": "1,2,3",
                "rid_prefix": "shared",
                "format": "speculators",
                "dataset": "/unused.jsonl",
            }
        )
    )
    out_dir = tmp_path / "patch"
    env = {"PYTHONPATH": str(REPO / "files" / "python")}
    r = subprocess.run(
        [sys.executable, "-m", "hsextract", "capture-patch", "--config", str(config), "--out-dir", str(out_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    rendered = (out_dir / "hsextract_capture_patch" / "__init__.py").read_text()
    line = next(x for x in rendered.splitlines() if x.startswith("CONFIG = json.loads("))
    baked = json.loads(json.loads(line[len("CONFIG = json.loads(") : -1]))
    assert baked["rid_prefix"] == "shared"
    assert baked["aux_layer_ids"] == [1, 2, 3]
    assert baked["model_path"] == str(tiny_llama)


def _rendered_config(out: Path) -> dict:
    namespace: dict = {}
    exec((out / "hsextract_capture_patch" / "__init__.py").read_text(), namespace)
    return namespace["CONFIG"]


def test_writer_process_is_on_by_default_and_rendered_only_when_off_so_a_default_patch_keeps_its_bytes(tmp_path):
    default = render_patch(tmp_path / "default", CaptureConfig(**LLAMA))
    on = render_patch(tmp_path / "on", CaptureConfig(**LLAMA, writer_process=True))
    off = render_patch(tmp_path / "off", CaptureConfig(**LLAMA, writer_process=False))
    assert "writer_process" not in _rendered_config(default)
    assert (on / "hsextract_capture_patch" / "__init__.py").read_bytes() == (
        default / "hsextract_capture_patch" / "__init__.py"
    ).read_bytes()
    assert _rendered_config(off)["writer_process"] is False
    assert CaptureConfig.from_dict(_rendered_config(off)).writer_process is False
    assert CaptureConfig.from_dict(_rendered_config(default)).writer_process is True


def test_the_cli_writes_from_a_writer_process_unless_told_no_writer_process(tmp_path, capsys):
    from hsextract.capture.patch import add_arguments, run

    def rendered(*flags: str) -> dict:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        out = tmp_path / str(len(flags))
        run(
            parser.parse_args(
                [
                    "--out-dir",
                    str(out),
                    "--model",
                    "/m",
                    "--dump-dir",
                    "/d",
                    "--architecture",
                    "LlamaForCausalLM",
                    *flags,
                ]
            )
        )
        return _rendered_config(out)

    assert "writer_process" not in rendered()
    assert rendered("--no-writer-process")["writer_process"] is False
    assert "writer_process" not in rendered("--writer-process")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("True", True),
        ("true", True),
        ("1", True),
        ("yes", True),
        ("False", False),
        ("false", False),
        ("0", False),
        ("", True),
        ("None", True),
        (1, True),
        (0, False),
        (None, True),
    ],
)
def test_writer_process_given_as_text_is_normalised_and_unset_is_the_default(text, value):
    assert CaptureConfig(**LLAMA, writer_process=text).writer_process is value


def test_writer_process_that_is_not_a_yes_or_no_is_refused_with_its_name():
    with pytest.raises(ConfigError, match="writer_process='sometimes' is not a yes/no value"):
        CaptureConfig(**LLAMA, writer_process="sometimes")
