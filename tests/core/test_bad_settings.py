"""Bad settings are refused before they cost a run, in one line that says what and where.

Each case was once accepted, or answered with a traceback: a model directory without config.json
(the client silently lost its vocabulary check), layer ids past the model's depth (the patch was
written, and only the server's start failed), a negative layer id (taken for a flag), a
read-only output directory (raw OSError tracebacks, and a finalize that claimed to have written
files), and a drain waiting forever on a staging directory that does not exist.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def hsextract(*args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(REPO / "files" / "python"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "hsextract", *args], env=env, capture_output=True, text=True, timeout=300
    )


def _one_line_error(r: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, r.stderr[-3000:]
    return errors[0]


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8, "hidden_size": 64})
    )
    return path


@pytest.fixture
def read_only_dir(tmp_path) -> Path:
    """A read-only filesystem (root ignores file modes, so a mode would prove nothing)."""
    d = tmp_path / "ro"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def test_a_model_directory_without_config_json_is_refused_by_the_client(tmp_path, tiny_llama):
    model = tmp_path / "model"
    model.mkdir()
    for f in tiny_llama.iterdir():
        if f.name != "config.json":
            (model / f.name).symlink_to(f)
    (tmp_path / "d.jsonl").write_text('{"input_ids": [1, 2]}\n')
    r = hsextract(
        "extract",
        "--server",
        "http://127.0.0.1:9",
        "--dataset",
        str(tmp_path / "d.jsonl"),
        "--model",
        str(model),
        "--dump-dir",
        str(tmp_path / "dump"),
        "--output",
        str(tmp_path / "out"),
        "--format",
        "specforge",
    )
    assert r.returncode == 2
    assert f"model path {model}: no config.json there" in _one_line_error(r)


def test_capture_patch_refuses_layer_ids_past_the_models_depth(tmp_path, model):
    r = hsextract(
        "capture-patch",
        "--out-dir",
        str(tmp_path / "patch"),
        "--model",
        str(model),
        "--dump-dir",
        str(tmp_path / "dump"),
        "--aux-layers",
        "1,2,99",
    )
    assert r.returncode == 2
    line = _one_line_error(r)
    assert "[99] not in [0, 6]" in line and "8 layers" in line
    assert not (tmp_path / "patch").exists(), "no patch is written"


def test_a_negative_layer_id_is_a_value_refused_by_range_not_a_flag(tmp_path, model):
    r = hsextract(
        "capture-patch",
        "--out-dir",
        str(tmp_path / "patch"),
        "--model",
        str(model),
        "--dump-dir",
        str(tmp_path / "dump"),
        "--aux-layers",
        "-1,2,3",
    )
    assert r.returncode == 2
    assert "[-1] not in [0, 6]" in _one_line_error(r)


def test_capture_patch_final_hidden_follows_the_format_and_a_contradiction_is_refused(tmp_path, model):
    ok = hsextract(
        "capture-patch",
        "--out-dir",
        str(tmp_path / "patch"),
        "--model",
        str(model),
        "--dump-dir",
        str(tmp_path / "dump"),
        "--format",
        "speculators",
    )
    assert ok.returncode == 0, ok.stderr
    init = (tmp_path / "patch" / "hsextract_capture_patch" / "__init__.py").read_text()
    assert '\\"final_hidden\\": \\"pre_norm\\"' in init and '\\"format\\": \\"speculators\\"' in init
    bad = hsextract(
        "capture-patch",
        "--out-dir",
        str(tmp_path / "patch2"),
        "--model",
        str(model),
        "--dump-dir",
        str(tmp_path / "dump"),
        "--format",
        "speculators",
        "--final-hidden",
        "post_norm",
    )
    assert bad.returncode == 2
    assert "'post_norm' does not fit the format 'speculators', which needs 'pre_norm'" in _one_line_error(bad)


def test_aux_layers_no_sglang_draft_can_be_served_on_are_refused_before_the_run(tmp_path, model):
    deepseek = json.loads((model / "config.json").read_text()) | {"architectures": ["DeepseekV3ForCausalLM"]}
    (model / "config.json").write_text(json.dumps(deepseek))
    (tmp_path / "dump").mkdir()
    for cmd in (
        ["capture-patch", "--out-dir", str(tmp_path / "patch")],
        ["drain", "--output", str(tmp_path / "out"), "--format", "specforge"],
    ):
        r = hsextract(
            *cmd,
            "--model",
            str(model),
            "--dump-dir",
            str(tmp_path / "dump"),
            "--aux-layers",
            "1,3,6",
            "--layer-convention",
            "sglang",
        )
        assert r.returncode == 2, r.stderr[-2000:]
        assert "aux layers [1, 3, 6] (SGLang's convention" in _one_line_error(r)
        assert "cannot be served" in _one_line_error(r)
    assert not (tmp_path / "patch").exists() and not (tmp_path / "out").exists()


def test_drain_layer_ids_are_range_checked_without_a_model(tmp_path):
    (tmp_path / "dump").mkdir()
    r = hsextract(
        "drain",
        "--dump-dir",
        str(tmp_path / "dump"),
        "--output",
        str(tmp_path / "out"),
        "--format",
        "specforge",
        "--aux-layers",
        "0,2,3",
        "--layer-convention",
        "sglang",
    )
    assert r.returncode == 2
    assert "[0] below 1, the first valid id" in _one_line_error(r)


def test_a_drain_on_a_staging_directory_that_does_not_exist_stops_saying_so(tmp_path):
    missing = tmp_path / "no-such-staging"
    r = hsextract(
        "drain",
        "--dump-dir",
        str(missing),
        "--output",
        str(tmp_path / "out"),
        "--format",
        "specforge",
        "--exit-when-done",
    )
    assert r.returncode == 2
    line = _one_line_error(r)
    assert f"staging directory {missing} does not exist" in line and "--dump-dir" in line


def test_a_read_only_output_directory_is_one_line_for_the_drain(tmp_path, read_only_dir):
    (tmp_path / "dump").mkdir()
    r = hsextract(
        "drain", "--dump-dir", str(tmp_path / "dump"), "--output", str(read_only_dir / "out"), "--format", "specforge"
    )
    assert r.returncode == 2
    line = _one_line_error(r)
    assert f"output directory {read_only_dir / 'out'} is not writable" in line and "Read-only file system" in line


def test_a_read_only_output_directory_is_one_line_for_the_client(tmp_path, read_only_dir, tiny_llama):
    (tmp_path / "d.jsonl").write_text('{"input_ids": [1, 2]}\n')
    r = hsextract(
        "extract",
        "--server",
        "http://127.0.0.1:9",
        "--dataset",
        str(tmp_path / "d.jsonl"),
        "--model",
        str(tiny_llama),
        "--dump-dir",
        str(tmp_path / "dump"),
        "--output",
        str(read_only_dir / "out"),
        "--format",
        "specforge",
    )
    assert r.returncode == 2
    assert "is not writable (Read-only file system)" in _one_line_error(r)


def test_finalize_of_a_read_only_output_directory_fails_and_claims_nothing(tmp_path, read_only_dir):
    from hsextract.output.manifest import write_header
    from support.manifests import tiny_header

    staged = tmp_path / "out"
    staged.mkdir()
    write_header(staged, tiny_header())
    (staged / "manifest.jsonl").write_text("")
    subprocess.run(["umount", "-l", str(read_only_dir)], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(read_only_dir)], check=True)
    subprocess.run(["cp", "-a", str(staged), str(read_only_dir)], check=True)
    subprocess.run(["mount", "-o", "remount,ro", str(read_only_dir)], check=True)
    r = hsextract("finalize", "--output", str(read_only_dir / "out"))
    assert r.returncode != 0
    assert "Read-only file system" in _one_line_error(r)
    assert "wrote" not in r.stdout, r.stdout
