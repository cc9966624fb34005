"""Load an output directory with a trainer's own reader (in a subprocess) and compare with what was captured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from hsextract.formats.manifest import iter_entries

LOADER = Path(__file__).with_name("load_with_reader.py")
READER_DIR = {"specforge": "specforge", "speculators": "speculators", "speculators-v1": "speculators-v1",
              "modelopt": "modelopt"}


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
        elif fmt == "modelopt":
            assert got["input_ids"].dtype == torch.int64 and torch.equal(got["input_ids"], want.input_ids)
            assert torch.equal(got["loss_mask"], want.loss_mask)
            assert torch.equal(got["labels"][:-1], want.input_ids[1:])
            assert got["base_model_hidden_states"].dtype == torch.bfloat16
            assert got["base_model_hidden_states"].shape == (t, h)
            assert torch.equal(got["base_model_hidden_states"], final)
            assert got["aux_hidden_states"].shape == (t, k * h) and torch.equal(got["aux_hidden_states"], aux)
        else:
            assert got["input_ids"].dtype == torch.int64 and torch.equal(got["input_ids"], want.input_ids)
            assert torch.equal(got["loss_mask"].to(torch.int64), want.loss_mask)
            assert got["hidden_states"].dtype == torch.bfloat16 and got["hidden_states"].shape == (t, k * h)
            assert torch.equal(got["hidden_states"], aux)
            assert torch.equal(got["verifier_last_hidden_states"], final)
    if fmt == "modelopt":
        assert loaded["prenorm"] == [False] * len(entries), "ModelOpt would re-apply the final norm"
    if fmt not in ("specforge", "modelopt"):
        by_key = {e.output_index: e.tokens for e in entries}
        assert loaded["approx_lengths"] == [by_key[key] for key in loaded["keys"]]
