"""The real SGLang server on CPU with the capture staging FP8 rows (``precision: fp8``), the real client
and the real drain (``--precision fp8``): the set is the one a bf16 capture's staging, quantized by the
drain, gives of the same prompts. File for file the same bytes, and the same manifest lines but for
the run's own fields (the rids carry each run's id; the times).

The prompts go one at a time (``--max-in-flight 1``), so both servers run the same batches and the
forward passes give the same rows.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hsextract.capture.selfcheck import check_dump
from hsextract.output.manifest import iter_entries, read_header
from hsextract.staging.dumps import DONE_FILE, STATES_FILE, StateFileLayout, iter_dump_dirs
from support.client_run import env, extract_args
from support.server_dumps import wait_done
from support.sglang_server import PRENORM_SGLANG_LAYERS

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]

N = 8
LAYERS = ["--aux-layers", ",".join(map(str, PRENORM_SGLANG_LAYERS)), "--layer-convention", "sglang"]


def _dataset(path: Path) -> None:
    """Pre-tokenized lines of 5 to 60 tokens: several chunks of the servers' chunked prefill (16)."""
    rng = random.Random(53)
    lines = []
    for _ in range(N):
        n = rng.randint(5, 60)
        ids = [rng.randrange(10, 300) for _ in range(n)]
        lines.append(json.dumps({"input_ids": ids, "loss_mask": [int(i >= n // 2) for i in range(n)]}))
    path.write_text("\n".join(lines) + "\n")


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, (cmd[3], r.stdout[-2000:], r.stderr[-4000:])
    return r


def _extract_and_drain(server, model: Path, dataset: Path, out: Path) -> dict:
    """The client's run to its end (one prompt at a time), then the drain's; the run's accounts."""
    _run(
        extract_args(
            server.url,
            dataset,
            model,
            server.dump_dir,
            out,
            "--max-in-flight",
            "1",
            "--probe-timeout",
            "60",
            fmt="speculators",
        )
    )
    drain = [sys.executable, "-m", "hsextract", "drain", "--dump-dir", str(server.dump_dir), "--output", str(out)]
    _run(
        [*drain, "--format", "speculators", "--precision", "fp8", *LAYERS, "--exit-when-done", "--poll-interval", "0.1"]
    )
    status = json.loads(_run([sys.executable, "-m", "hsextract", "status", "--output", str(out), "--json"]).stdout)
    return status["accounts"]


def test_an_fp8_capture_and_a_bf16_capture_give_one_fp8_set_of_the_same_prompts(
    llama_fp8_server, llama_prenorm_server, tiny_llama, tmp_path
):
    dataset = tmp_path / "prompts.jsonl"
    _dataset(dataset)
    staged, drained = tmp_path / "fp8-staged", tmp_path / "bf16-staged"
    accounts = {
        "fp8": _extract_and_drain(llama_fp8_server, tiny_llama, dataset, staged),
        "bf16": _extract_and_drain(llama_prenorm_server, tiny_llama, dataset, drained),
    }
    for name, acc in accounts.items():
        assert (acc["lines"], acc["accepted"], acc["in_set"]) == (N, N, N), (name, acc)
        assert acc["failed"] == {} and acc["quarantined"] == {} and not acc["unaccounted"], (name, acc)
    assert read_header(staged).precision == read_header(drained).precision == "fp8"
    got = {e.dataset_index: e for e in iter_entries(staged)}
    want = {e.dataset_index: e for e in iter_entries(drained)}
    assert sorted(got) == sorted(want) == list(range(N))
    for i, e in got.items():
        w = want[i]
        # the output index (the file's number) is the drain's order of arrival, not the sample's
        assert (e.tokens, e.bytes, e.checksum, e.fingerprint) == (w.tokens, w.bytes, w.checksum, w.fingerprint)
        assert (staged / e.file).read_bytes() == (drained / w.file).read_bytes(), e.file


def test_the_fp8_capture_stages_half_the_bytes_of_its_rows_and_says_fp8(llama_fp8_server, tmp_path):
    server = llama_fp8_server
    ids = [random.Random(7).randrange(10, 300) for _ in range(40)]
    rid = f"{server.rid_prefix}-{'fe' * 4}-0"
    server.generate(ids, rid=rid)
    d = wait_done(server.dump_dir, rid)
    try:
        marker = json.loads((d / DONE_FILE).read_text())
        assert (marker["precision"], marker["dtype"]) == ("fp8", "bfloat16")
        layout = StateFileLayout(40, marker["num_aux"] + 1, marker["hidden_size"], precision="fp8")
        assert (d / STATES_FILE).stat().st_size == layout.file_size
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert not [p for p in iter_dump_dirs(server.dump_dir) if p.name == rid]


def test_the_smoke_tests_self_check_passes_an_fp8_dump_on_its_rows_dequantized(llama_fp8_server):
    server = llama_fp8_server
    ids = [random.Random(11).randrange(10, 300) for _ in range(30)]
    rid = f"{server.rid_prefix}-{'fd' * 4}-0"
    token = server.generate(ids, rid=rid)["output_ids"][0]
    d = wait_done(server.dump_dir, rid)
    try:
        result = check_dump(server.dump_dir, rid, server.model_dir, ids, token, server.url)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert result.ok, result.reasons
    assert result.details["precision"] == "fp8" and result.details["tie_tolerance"] > 0
    assert result.details["logprobs"]["compared"] > 0, result.details
