"""kill -9 at random instants: every sample ends up written exactly once, intact, and staging empties.

The drain is killed at least 20 times while it works through more than 200 real server dumps.
Dumps are released into staging a few at a time (as the capture completes them), and each kill
waits for a random number of the released samples to be committed, then a random sub-second
delay, so kills land while samples are being read, written, renamed and recorded.
"""

from __future__ import annotations

import random
import time

import pytest
import torch
from hsextract.output.manifest import iter_entries, verify_entry
from hsextract.output.run_id import load_or_create_run_id
from support.drain_proc import drain_until_done
from support.kill_loop import kill_drain_repeatedly
from support.server_dumps import capture

pytestmark = [pytest.mark.slow, pytest.mark.server, pytest.mark.timeout(900)]

N_SAMPLES = 216
MIN_KILLS = 20
PER_RELEASE = 8
TIME_BUDGET_S = 480


def test_kill_9_at_random_instants_loses_and_duplicates_nothing(llama_server, tiny_llama, tmp_path):
    dump, hold, out = tmp_path / "dump", tmp_path / "hold", tmp_path / "out"
    run_id = load_or_create_run_id(out)
    captured = capture(llama_server, dump, hold, run_id, list(range(N_SAMPLES)), min_len=8, max_len=96, seed=3)
    loop = kill_drain_repeatedly(
        hold=hold,
        dump=dump,
        out=out,
        names={i: c.rid for i, c in captured.items()},
        drain_args=["--model", str(tiny_llama), "--workers", "3", "--poll-interval", "0.05"],
        per_release=PER_RELEASE,
        max_delay_s=0.02,
        rng=random.Random(20261129),
        log=tmp_path / "drain.log",
        deadline=time.monotonic() + TIME_BUDGET_S,
    )
    assert not loop.pending, f"ran out of time after {loop.kills} kills"
    assert loop.kills_while_staged >= MIN_KILLS, (
        f"only {loop.kills_while_staged} of {loop.kills} kills landed while dumps were staged"
    )

    drain_until_done(dump, out, "specforge", "--model", str(tiny_llama), lines=N_SAMPLES)

    entries = list(iter_entries(out))
    assert [e.output_index for e in entries] == list(range(N_SAMPLES))
    assert sorted(e.dataset_index for e in entries) == list(range(N_SAMPLES)), "a sample is missing or twice"
    assert len({e.rid for e in entries}) == N_SAMPLES
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("data_*.ckpt"))
    assert files == sorted(e.file for e in entries), "a file on disk is not in the manifest, or vice versa"
    for e in entries:
        assert verify_entry(out, e) is None
        want = captured[e.dataset_index]
        got = torch.load(out / e.file, mmap=True, weights_only=True)
        k = want.hidden.shape[1] - 1
        assert torch.equal(got["input_ids"], want.input_ids)
        assert torch.equal(got["hidden_state"][0], want.hidden[:, k])
        assert torch.equal(got["aux_hidden_state"][0], want.hidden[:, :k].flatten(1))
    assert [p.name for p in dump.iterdir()] == ["_records"] and not any((dump / "_records").iterdir())
    assert not any(hold.iterdir())
    assert not any((out / ".hsextract" / "tmp").iterdir())
