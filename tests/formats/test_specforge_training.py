"""A set made by the real capture trains a drafter with SpecForge's own trainer, and exports for SGLang.

The readers' tests prove that each trainer loads the rows. This proves the next step a user takes:
`specforge train -c specforge-train.yaml` (the run file the drain writes beside the set) runs SpecForge
0.2.0's offline reader, vocabulary mapping, draft model, TTT loop and loss on the set, and
`specforge export --to sglang` gives a draft whose config tells SGLang to capture exactly the layers
the set was captured from. A format change that breaks training fails here, on a CPU
(support/train_with_specforge.py says what a CPU needs).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hsextract.draft_config import served_capture
from hsextract.output.manifest import read_header
from hsextract.output.run_id import load_or_create_run_id
from support.drain_proc import drain_until_done
from support.server_dumps import capture

pytestmark = [pytest.mark.server, pytest.mark.readers, pytest.mark.timeout(900)]

TRAINER = Path(__file__).resolve().parents[1] / "support" / "train_with_specforge.py"
SAMPLES = 8


def sharded_view(model: Path, into: Path) -> Path:
    """The model as SpecForge 0.2.0 reads a target's head: through a *.index.json, which a
    single-file checkpoint such as the tiny model's lacks (the run file's comment says so)."""
    from safetensors import safe_open

    into.mkdir()
    for f in model.iterdir():
        (into / f.name).symlink_to(f)
    with safe_open(str(model / "model.safetensors"), "pt") as st:
        weight_map = dict.fromkeys(st.keys(), "model.safetensors")
    (into / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return into


def train(readers: Path, run_file: Path, export: Path, *overrides: str) -> dict:
    result = export.parent / "trained.json"
    env = dict(os.environ, PYTHONPATH=str(readers / "specforge"), OMP_NUM_THREADS="2")
    done = subprocess.run(
        [sys.executable, str(TRAINER), str(run_file), str(export), str(result), *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"SpecForge failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(result.read_text())


@pytest.fixture(scope="module")
def drained_set(llama_server, tiny_llama, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("specforge-training")
    dump, out = root / "dump", root / "out"
    run_id = load_or_create_run_id(out)
    capture(llama_server, dump, dump, run_id, list(range(SAMPLES)), min_len=24, max_len=80, seed=11)
    drain_until_done(dump, out, "specforge", "--model", str(tiny_llama), lines=SAMPLES)
    return out


def test_the_drain_writes_a_draft_config_that_sglang_serves_on_the_sets_own_layers(drained_set):
    header = read_header(drained_set)
    config = json.loads((drained_set / "draft_config.json").read_text())
    ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert served_capture(header.architecture, ids) == header.sglang_layers_to_capture
    assert (config["architectures"], config["num_hidden_layers"], config["hidden_size"]) == (
        ["LlamaForCausalLMEagle3"],
        1,
        header.hidden_size,
    )
    assert config["draft_vocab_size"] == header.vocab_size < 32000  # 32000 asked for, clamped to the model's


def test_specforge_trains_on_the_set_from_its_run_file_and_exports_a_draft_for_sglang(
    drained_set, readers, tiny_llama, tmp_path
):
    header = read_header(drained_set)
    run_file = drained_set / "specforge-train.yaml"
    assert "No index.json file found" in run_file.read_text()  # the tiny model is a single-file checkpoint
    target = sharded_view(tiny_llama, tmp_path / "target")
    got = train(
        readers,
        run_file,
        tmp_path / "draft",
        "training.max_steps=3",
        "training.log_interval=1",
        f"model.target_model_path={target}",
        f"output_dir={tmp_path / 'train'}",
    )
    assert [s["step"] for s in got["steps"]] == [1, 2, 3]
    assert all(math.isfinite(s["loss"]) and s["loss"] > 0 for s in got["steps"]), got["steps"]
    ids = got["config"]["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert served_capture(header.architecture, ids) == header.sglang_layers_to_capture
    mapping = torch.load(drained_set / "vocab_mapping" / f"vocab_mapping-{header.vocab_size}.pt", weights_only=True)
    assert got["d2t"] == mapping["d2t"].tolist() and got["t2d"] == mapping["t2d"].tolist()
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(got["weights"])
