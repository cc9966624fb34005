"""The drafter bench's arms: SpecForge trains a drafter on each set with the same run file, seed and
steps, exports it for SGLang, and the two controls are made from them.

* A: hsextract's set, trained from the ``specforge-train.yaml`` the drain wrote beside it;
* B: the same run file pointed at arm B's rows (transformers');
* C: drafter A with its config's aux layer ids shifted by one (a negative control: the same weights
  fed the neighbouring layers at serving);
* floor: a drafter of the same config with SpecForge's random initialisation and A's vocabulary.

The two trainings run at once on one GPU, each a ``specforge train`` process. Checkpoints are saved
every epoch; if the time budget runs out, both stop and the latest epoch both finished is exported,
so the arms always have the same steps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

RUN_FILE = "specforge-train.yaml"


def train_args(
    set_dir: Path,
    run_dir: Path,
    name: str,
    *,
    epochs: int,
    batch: int,
    lr: float,
    steps_per_epoch: int,
    rows: Path | None = None,
    seed: int = 0,
) -> list[str]:
    """``specforge train`` of arm ``name``: the set's own run file with the bench's overrides."""
    overrides = [
        f"output_dir={run_dir}",
        f"run_id={name}",
        f"training.num_epochs={epochs}",
        f"training.batch_size={batch}",
        f"training.learning_rate={lr}",
        f"training.seed={seed}",
        f"training.save_interval={steps_per_epoch}",
        "training.log_interval=20",
        "training.attention_backend=sdpa",
        "data.dataloader_num_workers=4",
    ]
    if rows is not None:
        overrides.append(f"data.hidden_states_path={rows}")
    return ["-m", "specforge.cli", "train", "-c", str(set_dir / RUN_FILE), *overrides]


def run_trainings(arms: dict[str, list[str]], env: dict[str, str], logs: Path, deadline: float) -> dict:
    """Run every arm's training at once; stop them all at the deadline. Returns each arm's exit
    status, wall time and logged steps."""
    procs, files, started = {}, {}, time.monotonic()
    for name, args in arms.items():
        files[name] = open(logs / f"train-{name}.log", "wb")  # noqa: SIM115 (closed below)
        procs[name] = subprocess.Popen(
            [sys.executable, *args], stdout=files[name], stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    stopped = False
    while any(p.poll() is None for p in procs.values()):
        if time.monotonic() > deadline and not stopped:
            for p in procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, 15)
            stopped = True
        time.sleep(1)
    for f in files.values():
        f.close()
    result = {}
    for name, p in procs.items():
        text = (logs / f"train-{name}.log").read_text(errors="replace")
        steps = [
            (int(m.group(1)), float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^step (\d+): \{.*?'acc_0': ([0-9.e-]+).*?'loss': ([0-9.e-]+)", text, re.M)
        ]
        result[name] = {
            "rc": p.returncode,
            "stopped_at_deadline": stopped,
            "wall_s": round(time.monotonic() - started, 1),
            "logged": [{"step": s, "acc_0": a, "loss": lo} for s, a, lo in steps],
            "tail": None if p.returncode == 0 else text[-3000:],
        }
    return result


def common_checkpoint(run_dir: Path, names: list[str]) -> int | None:
    """The latest step every arm saved a checkpoint at."""
    steps = []
    for name in names:
        found = {
            int(m.group(1)) for p in run_dir.glob(f"{name}-step*") if (m := re.fullmatch(rf"{name}-step(\d+)", p.name))
        }
        steps.append(found)
    common = set.intersection(*steps) if steps else set()
    return max(common) if common else None


def export(env: dict[str, str], checkpoint: Path, draft_config: Path, mapping: Path, dest: Path, log: Path) -> None:
    with open(log, "ab") as f:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "specforge.cli",
                "export",
                "--to",
                "sglang",
                "--checkpoint",
                str(checkpoint),
                "--draft-config",
                str(draft_config),
                "--output-dir",
                str(dest),
                "--vocab-mapping",
                str(mapping),
            ],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            check=True,
        )


def shifted_copy(draft: Path, dest: Path, by: int = 1) -> list[int]:
    """Arm C: ``draft`` with every aux layer id of its config moved by ``by``; the new ids."""
    shutil.copytree(draft, dest, dirs_exist_ok=True)
    config = json.loads((dest / "config.json").read_text())
    ids = [i + by for i in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return ids


RANDOM_DRAFT = r"""
import sys, torch
from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig
from specforge.export.to_sglang import WEIGHT_MAPS, _serving_state
config_path, mapping, dest, seed = sys.argv[1:5]
torch.manual_seed(int(seed))
model = AutoDraftModel.from_config(AutoDraftModelConfig.from_file(config_path), torch_dtype=torch.bfloat16)
if mapping:
    model.load_vocab_mapping(mapping)
state = {k: v for k, v in model.state_dict().items() if "embed" not in k.lower()}
model.save_pretrained(dest, state_dict=_serving_state(state, WEIGHT_MAPS[type(model).__name__]))
"""


def random_draft(env: dict[str, str], draft_config: Path, mapping: Path | None, dest: Path, seed: int = 0) -> None:
    """The floor: SpecForge's own draft class at its initialisation, saved as its exporter saves a
    trained one (no embedding: SGLang takes the target's)."""
    subprocess.run(
        [sys.executable, "-c", RANDOM_DRAFT, str(draft_config), str(mapping or ""), str(dest), str(seed)],
        env=env,
        check=True,
        capture_output=True,
    )
