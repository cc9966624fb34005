"""kill -9 at random instants: every sample ends up written exactly once, intact, and staging empties.

The drain is killed at least 20 times while it works through more than 200 real server dumps.
Dumps are released into staging a few at a time (as the capture completes them), and each kill
waits for a random number of the released samples to be committed, then a random sub-second
delay, so kills land while samples are being read, written, renamed and recorded.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest
import torch
from drain.drain_proc import drain_until_done, start
from drain.server_dumps import capture
from hsextract.formats.manifest import entries_path, iter_entries, verify_entry
from hsextract.records import load_or_create_run_id

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]

N_SAMPLES = 216
MIN_KILLS = 20
PER_RELEASE = 8
TIME_BUDGET_S = 480


def _manifest_lines(out) -> int:
    try:
        return entries_path(out).read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def test_kill_9_at_random_instants_loses_and_duplicates_nothing(llama_server, tiny_llama, tmp_path):
    dump, hold, out = tmp_path / "dump", tmp_path / "hold", tmp_path / "out"
    run_id = load_or_create_run_id(out)
    captured = capture(llama_server, dump, hold, run_id, list(range(N_SAMPLES)), min_len=8, max_len=96, seed=3)
    rng = random.Random(20261129)
    pending = sorted(captured)
    kills = kills_with_work = 0
    deadline = time.monotonic() + TIME_BUDGET_S
    log = open(tmp_path / "drain.log", "w")  # noqa: SIM115 (closed below)
    try:
        while pending and time.monotonic() < deadline:
            release, pending = pending[:PER_RELEASE], pending[PER_RELEASE:]
            for i in release:
                os.rename(hold / captured[i].rid, dump / captured[i].rid)
            base = _manifest_lines(out)
            target = base + rng.randint(0, len(release) - 1)
            proc = start("drain", "--dump-dir", str(dump), "--output", str(out), "--format", "specforge",
                         "--model", str(tiny_llama), "--workers", "3", "--poll-interval", "0.05",
                         stdout=log, stderr=subprocess.STDOUT)
            try:
                until = time.monotonic() + 60
                while _manifest_lines(out) < target and proc.poll() is None and time.monotonic() < until:
                    time.sleep(0.001)
                time.sleep(rng.uniform(0, 0.02))
                if any(p.name.startswith("hsx-") for p in dump.iterdir()):
                    kills_with_work += 1
                os.kill(proc.pid, signal.SIGKILL)
                kills += 1
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
    finally:
        log.close()
    assert not pending, f"ran out of time after {kills} kills"
    assert kills_with_work >= MIN_KILLS, f"only {kills_with_work} of {kills} kills landed while dumps were staged"

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
