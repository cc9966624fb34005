"""The drain's logprob self-check on real server dumps: a sample whose final rows pass the greedy
check but do not give the server's own prompt logprobs is quarantined with the numbers; a server
that does not answer leaves every sample written and the checks counted as not done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hsextract.greedy_check import GreedyHead
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from hsextract.staging.dumps import DONE_FILE, STATES_FILE, read_done_marker, read_states, write_done_marker
from support.drain_proc import drain_until_done
from support.hf_reference import reference
from support.server_dumps import capture
from support.staged_dumps import restamp_fingerprint, write_states

pytestmark = [pytest.mark.server, pytest.mark.timeout(600)]


def replace_final_rows(d: Path, rows: torch.Tensor, model: Path) -> None:
    """The dump's final hidden states become ``rows``, and its greedy token the one they give (as if
    the server had sampled it): the greedy check passes them by construction."""
    states = read_states(d)
    hidden = states.hidden.clone()
    hidden[:, -1] = rows
    (d / STATES_FILE).unlink()
    write_states(d / STATES_FILE, hidden, states.input_ids.clone())
    marker = read_done_marker(d)
    head = GreedyHead(model)
    top = head.check(rows[-1], marker.final_hidden, 0).predicted
    marker.greedy_token = top
    (d / DONE_FILE).unlink()
    write_done_marker(d.parent, marker)
    restamp_fingerprint(d)  # as if the forward pass computed them


def status(out: Path) -> dict:
    return json.loads((out / ".hsextract" / "drain-status.json").read_text())


def test_the_drain_quarantines_samples_whose_final_rows_give_other_logprobs_with_the_numbers(
    llama_server, tiny_llama, tmp_path
):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run_id = load_or_create_run_id(out)
    n = 6
    samples = capture(llama_server, dump, dump, run_id, list(range(n)), min_len=8, max_len=40, seed=71)
    wrong = {}
    for i, what in ((0, "pre-norm rows taken for post-norm"), (1, "the layer before")):
        ids = samples[i].input_ids.tolist()
        ref = reference(tiny_llama, ids)
        rows = ref.pre_norm if i == 0 else GreedyHead(tiny_llama).final_states(ref.hidden_states[-2], "pre_norm")
        replace_final_rows(dump / samples[i].rid, rows.bfloat16(), tiny_llama)
        wrong[samples[i].rid] = what
    r = drain_until_done(
        dump,
        out,
        "specforge",
        "--model",
        str(tiny_llama),
        "--selfcheck-share",
        "1",
        "--selfcheck-server",
        llama_server.url,
        lines=n,
        expect_rc=3,
    )
    for rid, what in wrong.items():
        reason = (out / "quarantine" / rid / "reason.txt").read_text().splitlines()
        assert reason[0] == "logprob_mismatch", f"{what}: {reason}"
        assert "mean abs error" in reason[1] and "bound 0.1" in reason[1], reason[1]
    assert sorted(e.dataset_index for e in iter_entries(out)) == list(range(2, n))
    assert {e.greedy_check for e in iter_entries(out)} == {"passed"}
    s = status(out)
    logprob = s["selfcheck"]["logprob"]
    assert s["selfcheck"]["checked"] == n and s["selfcheck"]["greedy_failed"] == 0
    assert logprob["compared"] == n and logprob["failed"] == 2 and logprob["not_done"] == 0, logprob
    assert logprob["mean_abs_error_worst"] > logprob["bound"] == 0.1
    assert s["quarantined_by_reason"] == {"logprob_mismatch": 2}
    assert "logprob self-check: 6 samples compared with the server's logprobs, 2 quarantined" in r.stderr


def test_a_drain_whose_server_does_not_answer_writes_every_sample_and_counts_the_checks_not_done(
    llama_server, tiny_llama, tmp_path, free_port
):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run_id = load_or_create_run_id(out)
    n = 4
    capture(llama_server, dump, dump, run_id, list(range(n)), seed=72)
    r = drain_until_done(
        dump,
        out,
        "specforge",
        "--model",
        str(tiny_llama),
        "--selfcheck-share",
        "1",
        "--selfcheck-server",
        f"http://127.0.0.1:{free_port()}",
        lines=n,
    )
    assert sorted(e.dataset_index for e in iter_entries(out)) == list(range(n))
    assert {e.greedy_check for e in iter_entries(out)} == {"passed"}, "the greedy check still ran"
    logprob = status(out)["selfcheck"]["logprob"]
    assert logprob["compared"] == 0 and logprob["not_done"] == n, logprob
    assert set(logprob["not_done_by_reason"]) <= {"server_unreachable", "server_unreachable_recently"}
    assert logprob["not_done_by_reason"].get("server_unreachable", 0) >= 1
    assert f"logprob self-check NOT DONE for {n} of {n} greedy-checked samples" in r.stderr
