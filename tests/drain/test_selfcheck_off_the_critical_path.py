"""The self-check never sets the drain's pace: a check far slower than a sample leaves no tail.

On the H100 host a check of the 8B model's head took about 0.9 s, a sample milliseconds; the chosen
samples waited for one another's checks, and the last 7-9 of a short run were committed one a
second after the client had finished (issue 50). Here the model's head is 256 MiB (a pass over
it takes a few tenths of a second on 2 cores, a small sample a few milliseconds), and the client
stages its dumps as the GPU run did: at the drain's own pace for the unchecked samples, then a
burst of samples of the self-check's share, then one more, and ends. The run's last commit must
follow its last dump by at most three of the drain's commits (the last sample's, and the passes of
the checks under way and of those waiting, each pass's samples committed together), as
``hsextract status`` counts them after the client's end, with every chosen sample checked and the
wrong one quarantined, as before.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from hsextract.drain.core import DrainConfig, Drainer
from hsextract.drain.selfcheck import in_share
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from hsextract.staging.records import make_rid
from support.client_run import stop, tail, wait_exit, wait_for
from support.drain_proc import drain_args, drain_status, finish_client, hsextract, start
from support.head_model import logits, write_head_model
from support.staged_dumps import mark_done, stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

VOCAB = 1 << 21  # 2M rows x 64 in bf16: 256 MiB read by every pass over the head
SHARE = 0.3
FIRST = 4  # always checked: the first samples the drain sees (outside the share)
BURST = 8  # samples of the share, staged at once near the end


class Client:
    """Stages samples as the capture does: the rows, then (all at once) their done markers, each
    with the token the server sampled (for `wrong`: the least likely one)."""

    def __init__(self, dump: Path, run: str, head: torch.Tensor, wrong: int):
        self.dump, self.run, self.head, self.wrong = dump, run, head, wrong

    def stage(self, indices: list[int]) -> list[str]:
        staged = [stage_sample(self.dump, self.run, i, final_hidden="post_norm", done=False) for i in indices]
        scores = logits(self.head, torch.stack([s.hidden[-1, -1] for s in staged]))
        tokens = [
            int(row.argmin() if s.index == self.wrong else row.argmax()) for s, row in zip(staged, scores, strict=True)
        ]
        for s, token in zip(staged, tokens, strict=True):
            mark_done(self.dump, s, final_hidden="post_norm", greedy_token=token)
        return [s.rid for s in staged]


def _indices(run: str) -> tuple[list[int], list[int]]:
    """The dataset's indices whose rids fall outside the self-check's share, and the `BURST` inside
    it: the longest dataset (indices from 0) with that many in the share."""
    outside: list[int] = []
    inside: list[int] = []
    for i in range(1000):
        hit = in_share(make_rid("hsx", run, i), SHARE)
        if hit and len(inside) == BURST:
            break
        (inside if hit else outside).append(i)
    assert len(inside) == BURST and len(outside) >= FIRST + 4, "a run id whose rids the share hits too often"
    return outside, inside


def _in_set(out: Path) -> set[str]:
    return {e.rid for e in iter_entries(out)}


def _settled(out: Path, rids: list[str]) -> bool:
    return set(rids) <= _in_set(out) | {p.name for p in (out / "quarantine").glob("*")}


def test_the_last_commit_follows_the_clients_end_within_three_commits_and_every_chosen_sample_is_checked(tmp_path):
    dump, out, model = tmp_path / "dump", tmp_path / "out", tmp_path / "model"
    run = load_or_create_run_id(out)
    outside, inside = _indices(run)
    first, plain, last = outside[:FIRST], outside[FIRST:-1], outside[-1]
    client = Client(dump, run, write_head_model(model, VOCAB), wrong=first[1])
    dump.mkdir()
    log = tmp_path / "drain.log"
    args = ["--model", str(model), "--selfcheck-share", str(SHARE), "--selfcheck-first", str(FIRST)]
    args += ["--exit-when-done", "--poll-interval", "0.1", "--workers", "2", "--worker-mode", "threads"]
    args += ["--no-draft-vocab", "--max-failure-share", "1"]
    drain = start(*drain_args(dump, out, "specforge", *args), stdout=log.open("ab"), stderr=subprocess.STDOUT)
    try:
        firsts = client.stage(first)
        wait_for(lambda: _settled(out, firsts), 300, "the first samples checked and settled", log)
        for i in plain:  # the drain keeps level with the client
            (rid,) = client.stage([i])
            wait_for(lambda rid=rid: rid in _in_set(out), 120, f"{rid} in the set", log)
        burst = client.stage(inside[:BURST])
        (final,) = client.stage([last])
        finish_client(out, lines=len(outside) + BURST)  # the client's end: its last dump is staged
        assert wait_exit(drain, 300, log) == 0, tail(log)
    finally:
        stop(drain)

    shown = hsextract("status", "--output", str(out), "--json")
    after = json.loads(shown.stdout)["commits"]["after_client_end"]
    assert after["commits"] <= 3, f"{after}: the self-check set the pace\n{tail(log)}"
    assert final in _in_set(out)
    entries = list(iter_entries(out))
    status = drain_status(out)
    selfcheck = status["selfcheck"]
    assert selfcheck["checked"] == FIRST + BURST, json.dumps(selfcheck)
    assert selfcheck["greedy_failed"] == 1 and selfcheck["queue"]["skipped_for_load"] == 0, json.dumps(selfcheck)
    assert selfcheck["queue"]["waiting"] == selfcheck["queue"]["running"] == 0
    wrong = make_rid("hsx", run, client.wrong)
    assert (out / "quarantine" / wrong / "reason.txt").read_text().splitlines()[0] == "greedy_mismatch"
    by_rid = {e.rid: e.greedy_check for e in entries}
    assert {r for r, g in by_rid.items() if g in ("passed", "near_tie")} == set(firsts + burst) - {wrong}
    assert {r for r, g in by_rid.items() if not g} == {make_rid("hsx", run, i) for i in [*plain, last]}
    assert status["accounts"]["in_set"] == len(outside) + BURST - 1 and status["quarantined"] == 1


def test_samples_prepared_in_the_worker_processes_are_checked_and_a_wrong_one_quarantined(tmp_path):
    """A chosen sample is prepared where any other is, here in a worker process, and comes back
    with the final rows its check reads."""
    dump, out, model = tmp_path / "dump", tmp_path / "out", tmp_path / "model"
    run = load_or_create_run_id(out)
    client = Client(dump, run, write_head_model(model, 4096), wrong=2)
    rids = client.stage(list(range(6)))
    finish_client(out, lines=6)
    cfg = DrainConfig(
        dump_dir=dump,
        output=out,
        format="specforge",
        workers=2,
        worker_mode="processes",
        wait_for_worker_processes=True,  # every sample through the processes
        model_path=str(model),
        selfcheck_share=1.0,
        poll_interval_s=0.05,
        exit_when_done=True,
        max_failure_share=1.0,
        count_vocab=False,
    )
    drainer = Drainer(cfg)
    assert drainer.run() == 0
    by_rid = {e.rid: e.greedy_check for e in iter_entries(out)}
    assert by_rid == {r: "passed" for r in rids if r != make_rid("hsx", run, 2)}
    assert (out / "quarantine" / make_rid("hsx", run, 2) / "reason.txt").read_text().startswith("greedy_mismatch")
    assert drainer.stats.selfcheck["checked"] == 6 and drainer.stats.selfcheck["greedy_failed"] == 1
