"""An FP8 set made by the real capture trains a drafter with speculators' own trainer, as its bf16 twin does.

test_fp8_readers.py proves that speculators 0.9's reader, through hs_connectors' FP8Transfer
(``--hidden-states-backend fp8``), hands the trainer our dequantization of the FP8 rows. This proves
the step a user takes next: ``speculators train --data-path <set> --hidden-states-backend fp8`` runs
speculators 0.9.0's own trainer on the set (its config resolution, the backend, the drain's
draft-vocabulary files, ArrowDataset, packing sampler, collate with ``shift_batch``, the Eagle3
draft built on the tiny Llama verifier, hidden size 64 and the verifier's vocabulary, TTT loss,
optimizer), a few steps on a CPU (support/train_with_speculators.py says what a CPU needs), and its
losses track, step by step, those of the same samples drained in bf16 and trained alike.

The trainer read the FP8 set through FP8Transfer (the transfer it built is recorded). What the
backend does shows on a draft without Eagle3's default norms: those normalize every row the draft
reads, so a token's FP8 scale cancels and the values read unscaled (FileTransfer, the trainer's
default backend) train on nearly the same losses; with ``--no-norm-before-fc
--no-norm-before-residual`` the FP8 set trains as its bf16 twin through the backend, and on other
losses without it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hsextract.output.layout import run_file_path
from hsextract.output.manifest import iter_entries, read_header
from hsextract.output.run_id import load_or_create_run_id
from hsextract.staging.records import parse_rid
from support.drain_proc import drain_args, finish_client, start
from support.server_dumps import capture
from support.sglang_server import PRENORM_SGLANG_LAYERS

pytestmark = [pytest.mark.server, pytest.mark.readers, pytest.mark.timeout(900)]

TRAINER = Path(__file__).resolve().parents[1] / "support" / "train_with_speculators.py"
SAMPLES = 16
STEPS = 6
LAYERS = ["--aux-layers", ",".join(map(str, PRENORM_SGLANG_LAYERS)), "--layer-convention", "sglang"]
# FP8 (e4m3, one scale a token) moves each value by up to half a step, 2^-4 of its token's largest
# value (2.4-2.8 % of a row, relative L2, on the tiny Llama's rows: docs/formats.md), in the draft's
# input and in the verifier's targets alike. Both runs start from the same weights (the seed) and
# train on the same batches (the same rows in the same order), so only that rounding separates their
# losses: measured, at most 0.33 % of a step's loss (the draft's norms and its random start pass on
# about a tenth of the rows' error). 1 % allows three times that; FP8 values read unscaled, where the
# scale counts (`RAW`), moved the worst step's loss by 22-79 % in the runs made.
LOSS_TOLERANCE = 0.01
# Eagle3's defaults normalize what it reads (--norm-before-fc: the aux rows before its fc;
# --norm-before-residual: the fc's output; the verifier's norm: the final row), so a token's scale
# cancels and FP8 values read unscaled train on nearly the same losses. Without those norms not:
# that draft shows what the backend does.
RAW = ["--no-norm-before-fc", "--no-norm-before-residual"]


def drain_in_order(held: Path, records: Path, dump: Path, out: Path, *args: str) -> None:
    """Drain the captured dumps of `held` into `out`, handing the drain one at a time, in the order
    of their dataset indices, each when the last is written: the set's rows are then in that order,
    whatever the drain's scans would have taken first."""
    shutil.copytree(records, dump)
    cmd = drain_args(dump, out, "speculators", "--exit-when-done", "--poll-interval", "0.1", *args)
    with open(out.parent / f"{out.name}-drain.log", "w+") as log:
        proc = start(*cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            for n, rid in enumerate(sorted(os.listdir(held), key=lambda r: parse_rid(r).index), 1):
                shutil.copytree(held / rid, dump / f"_{rid}")  # a name the drain skips, then whole at once
                os.rename(dump / f"_{rid}", dump / rid)
                deadline = time.monotonic() + 60
                while written(out) < n and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert written(out) == n, f"sample {n} ({rid}) not written"
            finish_client(out, SAMPLES)  # the client's word that all is sent: the drain finalizes and exits
            assert proc.wait(timeout=120) == 0, "the drain failed"
        except BaseException:
            proc.kill()
            proc.wait()
            log.seek(0)
            print(log.read()[-4000:])
            raise


def written(out: Path) -> int:
    try:
        return sum(1 for _ in iter_entries(out))
    except (OSError, ValueError):
        return 0  # no manifest yet


@pytest.fixture(scope="module")
def sets(llama_prenorm_server, tiny_llama, tmp_path_factory) -> dict[str, Path]:
    """The same captured samples drained twice, into FP8 rows and into bf16 rows (one run id).

    The trainer splits and packs the rows by their order, so both sets must hold the same samples in
    the same order: each drain gets the same dumps in the dataset's order (`drain_in_order`).
    """
    root = tmp_path_factory.mktemp("speculators-training")
    held, records, sets = root / "held", root / "records", {"fp8": root / "fp8", "bf16": root / "bf16"}
    run_id = load_or_create_run_id(sets["fp8"])
    sets["bf16"].mkdir()
    shutil.copy(run_file_path(sets["fp8"]), run_file_path(sets["bf16"]))
    capture(llama_prenorm_server, records, held, run_id, list(range(SAMPLES)), min_len=24, max_len=64, seed=52)
    for precision, out in sets.items():
        model = ["--model", str(tiny_llama), *LAYERS, "--precision", precision]
        drain_in_order(held, records, root / f"dump-{precision}", out, *model)
    return sets


def train_args(data: Path, backend: str, work: Path, tiny_llama: Path, *extra: str) -> list[str]:
    """`speculators train`'s arguments: the set, its backend, the tiny verifier and the set's own
    layers and draft vocabulary; a few steps of one epoch; a CPU's switches (train_with_speculators.py)."""
    header = read_header(data)
    return [
        *["--verifier-name-or-path", str(tiny_llama), "--data-path", str(data)],
        *["--hidden-states-backend", backend, "--speculator-type", "eagle3"],
        *["--target-layer-ids", *map(str, header.eagle_aux_hidden_state_layer_ids)],
        *["--draft-vocab-size", str(header.vocab_size)],
        *["--total-seq-len", "96", "--train-data-ratio", "0.75", "--epochs", "1", "--max-steps", str(STEPS)],
        *["--seed", "0", "--save-path", str(work / "checkpoints"), "--log-dir", str(work / "logs")],
        *["--draft-attn-impl", "sdpa", "--loss-implementation", "eager", "--num-workers", "0"],
        *extra,
    ]


def train(readers: Path, runs: dict[str, list[str]], work: Path) -> dict:
    spec, result = work / "runs.json", work / "trained.json"
    spec.write_text(json.dumps(runs))
    env = dict(os.environ, PYTHONPATH=str(readers / "speculators"), OMP_NUM_THREADS="2")
    done = subprocess.run(
        [sys.executable, str(TRAINER), str(spec), str(result)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (
        f"speculators failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )
    return json.loads(result.read_text())


def apart(a: float, b: float) -> float:
    """How far loss `a` is from loss `b`, as a share of `b`."""
    return abs(a - b) / b


def test_speculators_trains_on_the_fp8_set_as_on_its_bf16_twin(sets, readers, tiny_llama, tmp_path):
    order = {name: [(e.output_index, e.dataset_index) for e in iter_entries(d)] for name, d in sets.items()}
    assert order["fp8"] == order["bf16"], "the two sets' rows are the same samples in the same order"
    assert (read_header(sets["fp8"]).precision, read_header(sets["bf16"]).precision) == ("fp8", "bf16")
    runs = {
        "fp8": train_args(sets["fp8"], "fp8", tmp_path / "fp8", tiny_llama),
        "bf16": train_args(sets["bf16"], "file", tmp_path / "bf16", tiny_llama),
        "fp8 without backend": train_args(sets["fp8"], "file", tmp_path / "unscaled", tiny_llama),
        "raw fp8": train_args(sets["fp8"], "fp8", tmp_path / "raw-fp8", tiny_llama, *RAW),
        "raw bf16": train_args(sets["bf16"], "file", tmp_path / "raw-bf16", tiny_llama, *RAW),
        "raw fp8 without backend": train_args(sets["fp8"], "file", tmp_path / "raw-unscaled", tiny_llama, *RAW),
    }
    got = train(readers, runs, tmp_path)
    losses = {name: [s["loss"] for s in r["steps"]] for name, r in got.items()}
    val = {name: r["val"][-1]["loss_epoch"] for name, r in got.items()}
    print(json.dumps({"steps": losses, "val": val}))  # for the record: what the tolerances are set against
    transfers = {name: r["transfer"] for name, r in got.items()}
    backends = {name: args[args.index("--hidden-states-backend") + 1] for name, args in runs.items()}
    assert transfers == {name: {"fp8": "FP8Transfer", "file": "FileTransfer"}[b] for name, b in backends.items()}
    for name, steps in losses.items():
        assert len(steps) == STEPS and all(math.isfinite(x) and x > 0 for x in steps), (name, steps)
    assert len(set(losses["bf16"])) == STEPS, "each step trained on its own batch"
    assert losses["fp8"] != losses["bf16"], "the FP8 rows' rounding reached the trainer"
    # FP8 through the backend tracks bf16; so do FP8 values read unscaled where Eagle3's norms cancel the scale.
    for fp8, bf16 in (("fp8", "bf16"), ("raw fp8", "raw bf16"), ("fp8 without backend", "bf16")):
        for step, (a, b) in enumerate(zip(losses[fp8], losses[bf16], strict=True), 1):
            assert apart(a, b) <= LOSS_TOLERANCE, f"{fp8}, step {step}: {a} against bf16's {b}"
        assert apart(val[fp8], val[bf16]) <= LOSS_TOLERANCE, (fp8, val)
    unscaled = [apart(a, b) for a, b in zip(losses["raw fp8 without backend"], losses["raw bf16"], strict=True)]
    assert max(unscaled) > 5 * LOSS_TOLERANCE, f"without the backend the losses are others: {unscaled}"
