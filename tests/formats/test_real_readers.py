"""Real dumps from the real server, drained to each format, load with the trainers' OWN readers.

The readers accept bad data silently (wrong shapes pass, mismatched token ids are dropped, a
missing length falls back to a guess), so every test asserts shapes, dtypes, values, error
counts and lengths itself. Each reader runs in a subprocess with its own --target install.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from drain.drain_proc import drain_until_done
from drain.server_dumps import capture
from hsextract.formats.manifest import iter_entries, read_header, verify_entry
from hsextract.records import load_or_create_run_id
from support.sglang_server import start_server

pytestmark = [pytest.mark.server, pytest.mark.readers, pytest.mark.timeout(900)]

LOADER = Path(__file__).with_name("load_with_reader.py")
READER_DIR = {"specforge": "specforge", "speculators": "speculators", "speculators-v1": "speculators-v1"}
N_SAMPLES = 12


@pytest.fixture(scope="session")
def readers() -> Path:
    root = os.environ.get("HSEXTRACT_READERS")
    if not root:
        pytest.skip("HSEXTRACT_READERS is not set: install requirements/readers.txt (make venv) to run reader tests")
    return Path(root)


@pytest.fixture(scope="module")
def prenorm_server(request, tmp_path_factory, tiny_llama, free_port):
    """A server capturing the final hidden state PRE-norm (the speculators formats need it)."""
    base = tmp_path_factory.mktemp("prenorm-server")
    handle = start_server(tiny_llama, port=free_port(), dump_dir=base / "dump", log_dir=base / "logs",
                          rid_prefix="hsx", final_hidden="pre_norm")
    request.addfinalizer(handle.stop)
    return handle


def load_with_reader(readers: Path, fmt: str, root: Path, num_aux: int, hidden: int) -> dict:
    result = root.parent / f"{fmt}-reader.pt"
    env = dict(os.environ, PYTHONPATH=str(readers / READER_DIR[fmt]), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(LOADER), fmt, str(root), str(result), "--num-aux", str(num_aux),
                        "--hidden", str(hidden)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{fmt} reader failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return torch.load(result, weights_only=False)


def assert_reader_sees_captured(fmt: str, out: Path, loaded: dict, captured: dict) -> None:
    entries = list(iter_entries(out))
    assert sorted(e.dataset_index for e in entries) == sorted(captured)
    assert loaded["modules"] == [], "a reader pulled in sglang or vllm"
    assert loaded["error_records"] == 0
    assert sorted(loaded["samples"]) == [e.output_index for e in entries]
    for e in entries:
        got, want = loaded["samples"][e.output_index], captured[e.dataset_index]
        k = want.hidden.shape[1] - 1
        t, h = want.hidden.shape[0], want.hidden.shape[2]
        aux = want.hidden[:, :k, :].reshape(t, k * h)
        final = want.hidden[:, k, :]
        if fmt == "specforge":
            expected_mask = want.loss_mask.clone()
            expected_mask[-1] = 0  # SpecForge's normalizer zeroes the last position
            assert got["input_ids"].dtype == torch.int64 and torch.equal(got["input_ids"], want.input_ids[None])
            assert torch.equal(got["loss_mask"], expected_mask[None])
            assert got["hidden_state"].dtype == torch.bfloat16 and got["hidden_state"].shape == (1, t, k * h)
            assert torch.equal(got["hidden_state"], aux[None])
            assert got["target"].shape == (1, t, h) and torch.equal(got["target"], final[None])
        else:
            assert got["input_ids"].dtype == torch.int64 and torch.equal(got["input_ids"], want.input_ids)
            assert torch.equal(got["loss_mask"].to(torch.int64), want.loss_mask)
            assert got["hidden_states"].dtype == torch.bfloat16 and got["hidden_states"].shape == (t, k * h)
            assert torch.equal(got["hidden_states"], aux)
            assert torch.equal(got["verifier_last_hidden_states"], final)
    if fmt != "specforge":
        by_key = {e.output_index: e.tokens for e in entries}
        assert loaded["approx_lengths"] == [by_key[key] for key in loaded["keys"]]


@pytest.mark.parametrize("fmt", ["specforge", "speculators", "speculators-v1"])
def test_drained_real_dumps_load_with_the_trainers_reader(request, fmt, readers, tiny_llama, tmp_path):
    server = request.getfixturevalue("llama_server" if fmt == "specforge" else "prenorm_server")
    dump, out = tmp_path / "dump", tmp_path / "out"
    run_id = load_or_create_run_id(out)
    captured = capture(server, dump, dump, run_id, list(range(N_SAMPLES)), seed=hash(fmt) % 1000)
    drain_until_done(dump, out, fmt, "--model", str(tiny_llama))
    header = read_header(out)
    assert header.format == fmt
    assert header.final_hidden == ("post_norm" if fmt == "specforge" else "pre_norm")
    assert header.eagle_aux_hidden_state_layer_ids == [1, 3, 4]  # the default [1, L//2-1, L-4], L = 8
    assert header.sglang_layers_to_capture == [2, 4, 5]
    assert all(verify_entry(out, e) is None for e in iter_entries(out))
    assert not [p for p in dump.iterdir() if p.name != "_records"] and not list((dump / "_records").iterdir())
    loaded = load_with_reader(readers, fmt, out, num_aux=3, hidden=64)
    assert_reader_sees_captured(fmt, out, loaded, captured)
