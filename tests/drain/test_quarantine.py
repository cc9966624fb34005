"""Corrupt copies of real server dumps are quarantined with the right reason; the rest go through."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from hsextract.greedy_check import GreedyHead, rms_norm
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from hsextract.staging.dumps import (
    DONE_FILE,
    STATES_FILE,
    StateFileLayout,
    read_done_marker,
    read_states,
    write_done_marker,
)
from hsextract.staging.records import read_record, record_path
from safetensors import safe_open
from support.drain_proc import drain_until_done
from support.server_dumps import capture
from support.staged_dumps import restamp_fingerprint, write_states

pytestmark = [pytest.mark.server, pytest.mark.timeout(600)]


def truncate(d: Path, dump: Path, model: Path) -> None:
    p = d / STATES_FILE
    os.truncate(p, p.stat().st_size - 100)


def nan_rows(d: Path, dump: Path, model: Path) -> None:
    st = read_states(d)
    layout = StateFileLayout(st.hidden.shape[0], st.hidden.shape[1], st.hidden.shape[2])
    nan_row = torch.full((st.hidden.shape[1], st.hidden.shape[2]), float("nan"), dtype=torch.bfloat16)
    with open(d / STATES_FILE, "r+b") as f:
        f.seek(layout.hidden_offset(1))
        f.write(nan_row.view(torch.uint8).numpy().tobytes())
    restamp_fingerprint(d)  # as if the forward pass computed the NaN


def rows_changed_after_capture(d: Path, dump: Path, model: Path) -> None:
    st = read_states(d)
    layout = StateFileLayout(st.hidden.shape[0], st.hidden.shape[1], st.hidden.shape[2])
    with open(d / STATES_FILE, "r+b") as f:  # row 0 written where row 1 belongs: another batch's rows
        f.seek(layout.hidden_offset(1))
        f.write(st.hidden[0].contiguous().view(torch.uint8).numpy().tobytes())


def other_greedy_token(d: Path, dump: Path, model: Path) -> None:
    """The server's greedy token is not what the captured final state gives: the least likely one."""
    marker, st = read_done_marker(d), read_states(d)
    head = GreedyHead(model)
    with safe_open(str(head.head_file), framework="pt") as f:
        weight = f.get_tensor(head.head_name).float()
    h = st.hidden[-1, -1].float()
    if marker.final_hidden == "pre_norm":
        h = rms_norm(h, head._norm_weight(), head.eps)
    marker.greedy_token = int((weight @ h).argmin())
    (d / DONE_FILE).unlink()
    write_done_marker(dump, marker)


def other_tokens(d: Path, dump: Path, model: Path) -> None:
    rec = json.loads(record_path(dump, d.name).read_text())
    rec["input_ids"][2] = (rec["input_ids"][2] + 1) % 300  # the client asked for something else
    record_path(dump, d.name).write_text(json.dumps(rec))


def missing_slot(d: Path, dump: Path, model: Path) -> None:
    st = read_states(d)
    (d / STATES_FILE).unlink()
    write_states(d / STATES_FILE, st.hidden[:, 1:].clone(), st.input_ids.clone())  # one layer fewer


def no_done_marker(d: Path, dump: Path, model: Path) -> None:
    (d / DONE_FILE).unlink()
    old = time.time() - 3600
    for p in [*d.iterdir(), d]:
        os.utime(p, (old, old))


CORRUPTIONS = {
    "truncated": (truncate, "unreadable"),
    "nan_rows": (nan_rows, "non_finite"),
    "rows_changed_after_capture": (rows_changed_after_capture, "fingerprint_mismatch"),
    "greedy_token_not_given_by_the_rows": (other_greedy_token, "greedy_mismatch"),
    "wrong_token_ids": (other_tokens, "token_mismatch"),
    "wrong_shape": (missing_slot, "shape"),
    "missing_done_marker": (no_done_marker, "incomplete"),
}


def test_corrupted_real_dumps_are_quarantined_with_the_right_reason(llama_server, tiny_llama, tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run_id = load_or_create_run_id(out)
    n = len(CORRUPTIONS) + 3
    captured = capture(llama_server, dump, dump, run_id, list(range(n)), min_len=6, seed=7)
    expected_reason = {}
    for i, (name, (corrupt, reason)) in enumerate(CORRUPTIONS.items()):
        rid = captured[i].rid
        corrupt(dump / rid, dump, tiny_llama)
        expected_reason[rid] = (name, reason)
    r = drain_until_done(
        dump,
        out,
        "specforge",
        "--model",
        str(tiny_llama),
        "--incomplete-timeout",
        "60",
        "--selfcheck-share",
        "1",
        lines=n,
        expect_rc=3,
    )
    assert f"{len(CORRUPTIONS)} of {n} accepted samples quarantined" in r.stderr, "the run fails its check"
    for rid, (name, reason) in expected_reason.items():
        reason_file = out / "quarantine" / rid / "reason.txt"
        assert reason_file.exists(), f"{name}: not quarantined\n{r.stderr[-3000:]}"
        assert reason_file.read_text().splitlines()[0] == reason, f"{name}: {reason_file.read_text()}"
        assert (out / "quarantine" / rid / "record.json").exists()
    assert sorted(e.dataset_index for e in iter_entries(out)) == list(range(len(CORRUPTIONS), n))
    assert {e.greedy_check for e in iter_entries(out)} <= {"passed", "near_tie"}, "the sound dumps pass the self-check"
    assert all(e.fingerprint for e in iter_entries(out))
    assert [p.name for p in dump.iterdir()] == ["_records"] and not any((dump / "_records").iterdir())
    status = json.loads((out / ".hsextract" / "drain-status.json").read_text())
    assert status["quarantined"] == len(CORRUPTIONS)
    assert read_record(dump, captured[0].rid) is None
