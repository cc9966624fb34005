"""Client, capture and drain agree on one run, or refuse to start, naming both sides.

Each of these once lost every sample of a run without a word: a client whose staging directory
was not the capture's (the drain removed every dump as "no client record"), and a capture
rendered for post-norm states beside a speculators drain (every dump quarantined, status "OK").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.client_run import env

pytestmark = pytest.mark.server


def _hsextract(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hsextract", *args], env=env(), capture_output=True, text=True, timeout=timeout
    )


def _dataset(tmp_path: Path) -> Path:
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"question {i}"},
                        {"role": "assistant", "content": f"answer {i}"},
                    ]
                }
            )
            + "\n"
            for i in range(3)
        )
    )
    return data


def _extract(server, model: Path, dump: Path, out: Path, data: Path, fmt: str) -> subprocess.CompletedProcess:
    return _hsextract(
        "extract",
        "--server",
        server.url,
        "--dataset",
        str(data),
        "--model",
        str(model),
        "--dump-dir",
        str(dump),
        "--output",
        str(out),
        "--format",
        fmt,
        "--probe-timeout",
        "10",
    )


def test_a_client_staging_elsewhere_than_the_capture_is_refused_before_sending(llama_server, tiny_llama, tmp_path):
    elsewhere = tmp_path / "not-the-capture-dir"
    r = _extract(llama_server, tiny_llama, elsewhere, tmp_path / "out", _dataset(tmp_path), "specforge")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "no dump of it appeared in the staging directory" in r.stderr and str(elsewhere) in r.stderr
    assert "within 10 s" in r.stderr
    assert "no running capture has announced itself" in r.stderr, "it says that nothing captures into that dir"
    assert not list((elsewhere / "_records").glob("*.json")), "no sample was sent"
    assert not (tmp_path / "out" / ".hsextract" / "client-summary.json").exists()


def test_a_client_whose_format_needs_another_norm_placement_than_the_capture_is_refused(
    llama_server, tiny_llama, tmp_path
):
    out = tmp_path / "out"
    r = _extract(llama_server, tiny_llama, llama_server.dump_dir, out, _dataset(tmp_path), "speculators")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "writes post_norm final hidden states" in r.stderr and "'speculators' needs pre_norm" in r.stderr
    assert "--format speculators" in r.stderr, "it says how to fix it"
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    assert not list(llama_server.dump_dir.glob(f"hsx-{run_id}-*")), "the probe's dump is removed, nothing was sent"


def test_a_drain_whose_format_needs_another_norm_placement_than_the_capture_is_refused(llama_server, tmp_path):
    r = _hsextract(
        "drain", "--dump-dir", str(llama_server.dump_dir), "--output", str(tmp_path / "out"), "--format", "speculators"
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert "writes post_norm final hidden states" in r.stderr and "needs pre_norm" in r.stderr
    assert f"port {llama_server.port}" in r.stderr, "it names the server whose capture disagrees"


def test_a_client_and_drain_that_agree_with_the_capture_start(llama_server, tiny_llama, tmp_path):
    out = tmp_path / "out"
    r = _extract(llama_server, tiny_llama, llama_server.dump_dir, out, _dataset(tmp_path), "specforge")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "start-up probe: the capture stages post_norm final hidden states" in r.stderr
    summary = json.loads((out / ".hsextract" / "client-summary.json").read_text())
    assert summary["ok"] == 3
    d = _hsextract(
        "drain",
        "--dump-dir",
        str(llama_server.dump_dir),
        "--output",
        str(out),
        "--format",
        "specforge",
        "--exit-when-done",
        "--poll-interval",
        "0.1",
    )
    assert d.returncode == 0, d.stderr[-3000:]
    assert "3 accepted = 3 in the set + 0 failed + 0 quarantined" in d.stderr
