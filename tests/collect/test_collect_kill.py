"""kill -9 at any instant of a collect, then run it again: the same collected set as an uninterrupted
collect, nothing lost or duplicated at any point."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest
from hsextract.output.manifest import entries_path, iter_entries
from hsextract.shard import Shard
from support.drain_proc import hsextract, start
from support.fleet import HostPlan, make_fleet
from support.kill_loop import manifest_lines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

LINES = 240
KILLS = 6
# The files a collect writes that must come out the same, byte for byte (the Arrow data files carry
# a build id in their names and are compared by their rows; the card and report name the set's path).
SAME_BYTES = [
    "manifest.json",
    "manifest.jsonl",
    "run.json",
    "token_freq.pt",
    "d2t.npy",
    "t2d.npy",
    "draft_vocab.json",
    ".hsextract/vocab_counts.json",
    ".hsextract/rejects.jsonl",
    ".hsextract/failures.jsonl",
    ".hsextract/client-summary.json",
    ".hsextract/dataset.json",
]


def _complete_lines(out) -> list[bytes]:
    try:
        data = entries_path(out).read_bytes()
    except FileNotFoundError:
        return []
    return data[: data.rfind(b"\n") + 1].splitlines()


def _files(root) -> set[str]:
    out = set()
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), root)
            if not (n.startswith("data-") and n.endswith(".arrow")) and not n.endswith(".lock"):
                out.add(rel)
    return out


def test_a_collect_killed_at_random_instants_and_run_again_gives_the_uninterrupted_set(tmp_path):
    import datasets

    plans = [
        HostPlan("a", Shard(0, 3), rejected={30}),
        HostPlan("b", Shard(1, 3), failed={31}),
        HostPlan("c", Shard(2, 3)),
    ]
    fleet = make_fleet(tmp_path / "fleet", "speculators", plans, LINES)
    args = ["--workers", "2", "--draft-vocab-size", "16", "--", *fleet.args()]
    reference = tmp_path / "reference"
    r = hsextract("collect", "--into", str(reference), *args)  # the host outputs follow "--"
    assert r.returncode == 0, r.stderr
    want = _complete_lines(reference)
    assert len(want) == len(fleet.samples) == LINES - 2

    into = tmp_path / "collected"
    rng = random.Random(20261201)
    kills = kills_mid_copy = 0
    with open(tmp_path / "collect.log", "w") as log:
        while kills < KILLS:
            target = manifest_lines(into) + rng.randint(0, 40)
            proc = start("collect", "--into", str(into), *args, stdout=log, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 60
                while manifest_lines(into) < target and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.001)
                time.sleep(rng.uniform(0, 0.03))
                if proc.poll() is not None:
                    break  # it finished first: the loop has nothing left to interrupt
                tmp = into / ".hsextract" / "collect-tmp"
                kills_mid_copy += tmp.is_dir() and any(tmp.iterdir())
                os.kill(proc.pid, signal.SIGKILL)
                kills += 1
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            got = _complete_lines(into)
            assert got == want[: len(got)], f"after kill {kills}: the manifest is not a prefix of the uninterrupted one"
    assert kills >= 3 and kills_mid_copy >= 1, (kills, kills_mid_copy)

    r = hsextract("collect", "--into", str(into), *args)
    assert r.returncode == 0, r.stderr
    assert _complete_lines(into) == want
    for rel in SAME_BYTES:
        assert (into / rel).read_bytes() == (reference / rel).read_bytes(), rel
    for e in iter_entries(reference):
        assert (into / e.file).read_bytes() == (reference / e.file).read_bytes()
    assert _files(into) - {"README.md", ".hsextract/collect-report.json"} == _files(reference) - {
        "README.md",
        ".hsextract/collect-report.json",
    }, "no file left over, none missing"
    got, ref = (datasets.load_from_disk(str(p)).with_format(None) for p in (into, reference))
    assert got.to_dict() == ref.to_dict()
    assert not list((into / ".hsextract" / "collect-tmp").iterdir())
