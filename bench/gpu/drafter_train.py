"""The drafter bench's arms: SpecForge trains a drafter on each set with the same run file, settings
and steps, exports it for SGLang, and the served controls are made from them.

* A: hsextract's set, trained from the ``specforge-train.yaml`` the drain wrote beside it; A2: the
  same set and settings with another training seed (the training's own noise, measured);
* B, D2, S1 (and D): the same run file pointed at that arm's rows (``drafter_data``);
* C: drafter A with its config's aux layer ids shifted by one; C_far: drafter A fed a far layer set
  (the same weights, other layers' states at serving, no training);
* floor: a drafter of the same config with SpecForge's random initialisation and A's vocabulary.

The trainings run at once on one GPU, each a ``specforge train`` process with the same
``training.max_steps`` (which is also the cosine schedule's length). The step count comes from a short
calibration of all arms side by side (``calibrate``): the measured steps per second times the time the
budget leaves. Checkpoints are saved at the end and at a few points on the way; if the deadline comes
first, every arm stops and the latest step all of them saved is exported, so the arms always have the
same steps.
"""

from __future__ import annotations

import ast
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
    max_steps: int,
    batch: int,
    lr: float,
    ttt_length: int,
    save_interval: int,
    rows: Path | None = None,
    seed: int = 0,
    log_interval: int = 20,
    accumulation: int = 1,
) -> list[str]:
    """``specforge train`` of arm ``name``: the set's own run file with the bench's overrides (a cosine
    schedule over ``max_steps`` steps; epochs enough to reach them). A step of ``batch`` samples is
    ``accumulation`` micro-batches, and the teacher's head runs without full-vocabulary fp32 logits
    (SpecForge's exact ``compact_teacher``): five arms side by side fit one 80 GB GPU."""
    overrides = [
        f"output_dir={run_dir}",
        f"run_id={name}",
        "training.num_epochs=1000",
        f"training.max_steps={max_steps}",
        f"training.batch_size={batch // accumulation}",
        f"training.accumulation_steps={accumulation}",
        "training.compact_teacher=true",
        f"training.learning_rate={lr}",
        "training.lr_scheduler=cosine",
        f"training.ttt_length={ttt_length}",
        f"training.seed={seed}",
        f"training.save_interval={save_interval}",
        f"training.log_interval={log_interval}",
        "training.attention_backend=sdpa",
        "data.dataloader_num_workers=4",
    ]
    if rows is not None:
        overrides.append(f"data.hidden_states_path={rows}")
    return ["-m", "specforge.cli", "train", "-c", str(set_dir / RUN_FILE), *overrides]


STEP_LINE = re.compile(r"^step (\d+): (\{.*\})\s*$", re.M)


def logged_steps(text: str) -> list[dict]:
    """SpecForge's ``step N: {...}`` lines as dicts with their step (accuracies per draft position
    ``acc_<i>``, the loss, the learning rate, ...)."""
    out = []
    for m in STEP_LINE.finditer(text):
        try:
            values = ast.literal_eval(m.group(2))
        except (ValueError, SyntaxError):
            continue
        out.append({"step": int(m.group(1)), **values})
    return out


def position_accuracy(logged: list[dict], last: int = 5) -> dict[str, float]:
    """Each draft position's training accuracy (``acc_<i>``), the mean of the last ``last`` logged steps."""
    tail = logged[-last:]
    keys = sorted({k for row in tail for k in row if re.fullmatch(r"acc_\d+", k)}, key=lambda k: int(k[4:]))
    return {k: round(sum(r[k] for r in tail if k in r) / sum(k in r for r in tail), 4) for k in keys}


def steady_rate(times: list[tuple[float, int]]) -> float | None:
    """Steps per second from (seconds, step) observations, start-up left out: from the first step seen
    to the last."""
    seen = [(t, s) for t, s in times if s > 0]
    if len(seen) < 2 or seen[-1][1] == seen[0][1]:
        return None
    return (seen[-1][1] - seen[0][1]) / (seen[-1][0] - seen[0][0])


def steps_for(rate: float, seconds: float, *, multiple: int, least: int) -> int:
    """The step count ``rate`` steps/s reaches in ``seconds``, down to a ``multiple``, at least ``least``."""
    return max(least, int(rate * seconds) // multiple * multiple)


def run_trainings(arms: dict[str, list[str]], env: dict[str, str], logs: Path, deadline: float) -> dict:
    """Run every arm's training at once; stop them all at the deadline. Returns each arm's exit
    status, wall time, logged steps and the steps/s seen (the log polled once a second)."""
    procs, files, started = {}, {}, time.monotonic()
    seen: dict[str, list[tuple[float, int]]] = {name: [] for name in arms}
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
        for name in arms:
            steps = logged_steps((logs / f"train-{name}.log").read_text(errors="replace"))
            if steps and (not seen[name] or seen[name][-1][1] != steps[-1]["step"]):
                seen[name].append((time.monotonic() - started, steps[-1]["step"]))
    for f in files.values():
        f.close()
    result = {}
    for name, p in procs.items():
        text = (logs / f"train-{name}.log").read_text(errors="replace")
        logged = logged_steps(text)
        rate = steady_rate(seen[name])
        result[name] = {
            "rc": p.returncode,
            "stopped_at_deadline": stopped,
            "wall_s": round(time.monotonic() - started, 1),
            "steps_per_s": round(rate, 3) if rate else None,
            "first_step_s": seen[name][0][0] if seen[name] else None,
            "position_accuracy": position_accuracy(logged),
            "logged": [
                {k: v for k, v in row.items() if k == "step" or k == "loss" or k.startswith("acc_")} for row in logged
            ],
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


def relayered_copy(draft: Path, dest: Path, ids: list[int] | None = None, by: int = 1) -> list[int]:
    """Arms C and C_far: ``draft`` with its config's aux layer ids replaced by ``ids`` (or each moved by
    ``by``); the weights untouched. Returns the new ids."""
    shutil.copytree(draft, dest, dirs_exist_ok=True)
    config = json.loads((dest / "config.json").read_text())
    old = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    new = list(ids) if ids is not None else [i + by for i in old]
    if len(new) != len(old):
        raise ValueError(f"{dest}: {len(new)} aux layer ids {new} for a drafter trained on {len(old)} ({old})")
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = new
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return new


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
