"""`hsextract check-shm` compares the staging filesystem's free space with what the run needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hsextract.errors import ConfigError
from hsextract.ops.check_shm import ShmTooSmall, check
from hsextract.staging.room import PAGE, PAGES_PER_REQUEST, estimate_need, parse_size

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "files" / "python")}


def test_a_kimi_token_with_three_aux_layers_costs_57_kb_of_staging():
    need = estimate_need(hidden_size=7168, aux_layers=3, requests_in_flight=1, tokens_per_request=1)
    assert need.bytes_per_token == 7168 * 4 * 2 + 8 == 57352


def test_a_token_staged_in_fp8_costs_its_fp8_rows_its_id_and_its_scale_as_the_staged_file_lays_them_out():
    from hsextract.staging.dumps import StateFileLayout

    need = estimate_need(hidden_size=7168, aux_layers=3, requests_in_flight=1, tokens_per_request=1, precision="fp8")
    assert need.bytes_per_token == 7168 * 4 + 8 + 4 == 28684
    layout = StateFileLayout(100, 4, 7168, precision="fp8")
    assert layout.file_size - layout.data_start == 100 * need.bytes_per_token


def test_check_shm_sizes_a_capture_that_stages_fp8(tmp_path):
    args = ["--hidden-size", "64", "--max-in-flight", "2", "--max-tokens", "100", "--dump-dir", str(tmp_path)]
    got = {}
    for precision in ("bf16", "fp8"):
        r = subprocess.run(
            [sys.executable, "-m", "hsextract", "check-shm", *args, "--capture-precision", precision],
            env=ENV,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        got[precision] = json.loads(r.stdout)["bytes_per_token"]
    assert got == {"bf16": 64 * 4 * 2 + 8, "fp8": 64 * 4 + 12}


def test_the_estimate_is_requests_times_tokens_times_bytes_plus_pages_per_request():
    need = estimate_need(hidden_size=64, aux_layers=3, requests_in_flight=8, tokens_per_request=100)
    assert need.estimate_bytes == 8 * 100 * (64 * 4 * 2 + 8) + 8 * PAGES_PER_REQUEST * PAGE
    assert need.need_bytes == need.estimate_bytes


def test_a_watermark_above_the_estimate_is_the_need():
    need = estimate_need(
        hidden_size=64, aux_layers=3, requests_in_flight=1, tokens_per_request=10, watermark_bytes=1 << 30
    )
    assert need.need_bytes == 1 << 30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1073741824", 1 << 30),
        ("512M", 512 << 20),
        ("2G", 2 << 30),
        ("2GiB", 2 << 30),
        ("1.5k", 1536),
        ("10%", 100),
        ("", 0),
        (None, 0),
    ],
)
def test_sizes_parse_as_bytes_units_or_a_share_of_the_filesystem(text, expected):
    assert parse_size(text, total=1000) == expected


@pytest.mark.parametrize("text", ["lots", "12X", "150%"])
def test_a_malformed_size_is_a_config_error_quoting_it(text):
    with pytest.raises(ConfigError, match=repr(text).replace("%", "%")):
        parse_size(text, total=1000)


def test_a_filesystem_too_small_fails_with_free_need_and_what_to_change(tmp_path):
    need = estimate_need(hidden_size=7168, aux_layers=3, requests_in_flight=10**6, tokens_per_request=10**6)
    with pytest.raises(ShmTooSmall) as err:
        check(str(tmp_path), need, 10**6, 10**6)
    text = str(err.value)
    assert "free" in text and "needs" in text and "57352 bytes per token" in text
    assert "--max-in-flight" in text and "remount" in text


def test_enough_space_passes_and_reports_no_change(tmp_path):
    need = estimate_need(hidden_size=64, aux_layers=3, requests_in_flight=1, tokens_per_request=16)
    report = check(str(tmp_path), need, 1, 16)
    assert report["ok"] is True and report["changed"] is False and report["free_bytes"] >= report["need_bytes"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hsextract", "check-shm", *args], env=ENV, capture_output=True, text=True, timeout=60
    )


def write_model_config(path: Path, hidden: int = 64) -> Path:
    path.mkdir()
    (path / "config.json").write_text(
        json.dumps(
            {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8, "hidden_size": hidden, "vocab_size": 320}
        )
    )
    return path


def test_the_cli_reads_the_hidden_size_from_the_model_and_the_layer_count_from_the_ids(tmp_path):
    model = write_model_config(tmp_path / "m")
    result = run_cli(
        "--model",
        str(model),
        "--aux-layers",
        "1,3",
        "--max-in-flight",
        "2",
        "--max-tokens",
        "10",
        "--max-staged",
        "0",
        "--dump-dir",
        str(tmp_path / "not-yet" / "dumps"),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["bytes_per_token"] == 64 * 3 * 2 + 8 and report["tokens_in_flight"] == 20
    assert report["path"] == str(tmp_path)


def test_the_cli_takes_its_settings_from_the_shared_run_config(tmp_path):
    model = write_model_config(tmp_path / "m", hidden=128)
    config = tmp_path / "run.json"
    config.write_text(
        json.dumps(
            {
                "model": str(model),
                "max_in_flight": 3,
                "max_tokens": 7,
                "dump_dir": str(tmp_path),
                "max_staged": 0,
                "rid_prefix": "hsx",
                "format": "speculators",
            }
        )
    )
    result = run_cli("--config", str(config))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["bytes_per_token"] == 128 * 4 * 2 + 8 and report["tokens_in_flight"] == 21


def test_the_cli_fails_with_exit_4_and_the_numbers_when_space_is_short(tmp_path):
    model = write_model_config(tmp_path / "m", hidden=7168)
    result = run_cli(
        "--model", str(model), "--max-in-flight", "100000", "--max-tokens", "100000", "--dump-dir", str(tmp_path)
    )
    assert result.returncode == 4
    assert "100000 staged requests" in result.stderr and "GiB" in result.stderr


def test_the_cli_without_a_model_names_what_is_missing():
    result = run_cli()
    assert result.returncode == 2 and "--model" in result.stderr
