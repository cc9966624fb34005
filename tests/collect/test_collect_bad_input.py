"""Bad input to hsextract collect: one clear line each, the other hosts still collected, nothing
already collected lost. A wrong path, a host of another dataset or other layers, a missing host,
a host whose drain has not caught up (for a final collect) or still runs (for a move), a set
another collect holds, a full collector volume, a hard link across filesystems."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from hsextract.collect.lock import collected_set_lock
from hsextract.output.dataset_record import check_and_record
from hsextract.output.manifest import iter_entries, verify_entry
from hsextract.shard import Shard
from support.drain_proc import env, hsextract, start
from support.fleet import RUN_ID, HostPlan, drain_host, make_fleet, snapshot, three_hosts, tokens_of, write_dataset
from support.kill_loop import manifest_lines
from support.staged_dumps import stage_sample
from support.volumes import resize, small_volume

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _indices(into) -> list[int]:
    return sorted(e.dataset_index for e in iter_entries(into))


def _of_hosts(fleet, *names) -> list[int]:
    return sorted(x for x in fleet.samples if x % 3 in {"abc".index(n) for n in names})


def test_a_wrong_path_is_one_line_and_the_other_hosts_are_collected(fleets, collect, tmp_path):
    fleet, into = fleets("speculators"), tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args("a", "c"), f"b={tmp_path / 'no-such-host'}")
    assert code == 3
    assert f"host b refused: {tmp_path / 'no-such-host'}: no such directory; nothing of it was collected" in err
    assert _indices(into) == _of_hosts(fleet, "a", "c")


def test_a_host_of_another_dataset_is_refused_naming_both_datasets(fleets, collect, tmp_path):
    fleet = fleets("speculators")
    other = make_fleet(
        tmp_path / "other",
        "speculators",
        three_hosts()[1:2],
        30,
        dataset=write_dataset(tmp_path / "other.jsonl", 30, tag="other "),
    )
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args("a", "c"), f"b={other.hosts['b']}")
    assert code == 3
    line = next(x for x in err.splitlines() if x.startswith("host b "))
    assert "refused: dataset fingerprint is " in line and str(tmp_path / "other.jsonl") in line
    assert f"expected '{fleet.dataset}" in line and "(as host a has it)" in line
    assert "WARN shard 1/3 is in no host output (dataset indices 1, 4, 7, 10 ...)" in err
    assert _indices(into) == _of_hosts(fleet, "a", "c")


def test_a_host_with_other_layers_is_refused_by_field_expected_and_actual(fleets, collect, tmp_path):
    fleet = fleets("speculators").copy(tmp_path / "hosts")
    header = json.loads((fleet.hosts["c"] / "manifest.json").read_text())
    header["eagle_aux_hidden_state_layer_ids"] = [1, 2, 4]
    (fleet.hosts["c"] / "manifest.json").write_text(json.dumps(header))
    code, err = collect("--into", str(tmp_path / "collected"), *fleet.args())
    assert code == 3
    assert (
        f"host c ({fleet.hosts['c']}) refused: layers (eagle convention) is [1, 2, 4], expected [1, 3, 4] "
        "(as host a has it)"
    ) in err


def test_a_missing_host_is_named_by_its_shard_a_warning_until_the_final_collect(fleets, collect, tmp_path):
    fleet, into = fleets("speculators"), tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args("a", "b"))
    assert code == 0, err
    assert "WARN shard 2/3 is in no host output (dataset indices 2, 5, 8, 11 ...)" in err
    before = snapshot(into)
    code, err = collect("--into", str(into), "--final", *fleet.args("a", "b"))
    assert code == 3
    assert "FAIL shard 2/3 is in no host output" in err
    assert _indices(into) == _of_hosts(fleet, "a", "b")
    assert {k: v for k, v in snapshot(into).items() if "hs_" in k} == {k: v for k, v in before.items() if "hs_" in k}
    code, err = collect("--into", str(into), "--final", *fleet.args())
    assert code == 0, err
    assert _indices(into) == sorted(fleet.samples)


def test_a_final_collect_refuses_a_host_whose_drain_has_not_caught_up_and_takes_it_once_it_has(collect, tmp_path):
    fleet = make_fleet(tmp_path / "hosts", "speculators", [three_hosts()[0], three_hosts()[2]], 30)
    b, dump = tmp_path / "hosts" / "b", tmp_path / "dump-b"
    check_and_record(b, fleet.dataset, has_samples=False)
    drain_host(b, dump, "speculators", HostPlan("b", Shard(1, 3)), 30, range(1, 20, 3))  # client done, drain stopped
    left = {x: stage_sample(dump, RUN_ID, x, tokens_of(x)) for x in range(22, 30, 3)}  # staged, not drained yet
    hosts = [*fleet.args(), f"b={b}"]
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), "--final", *hosts)
    assert code == 3
    assert (
        f"host b ({b}) refused for --final: its drain has not caught up: 3 accepted sample(s) (dataset indices "
        "22, 25, 28) are in neither its set, its failures nor its quarantine; no drain runs on it: start its "
        "drain"
    ) in err
    code, err = collect("--into", str(into), *hosts)  # not final: what b has committed
    assert code == 0, err
    assert "host b: 10 accepted = 7 in the set + 0 failed + 0 quarantined + 3 on the way" in err
    drain = start(
        "drain",
        "--dump-dir",
        str(dump),
        "--output",
        str(b),
        "--format",
        "speculators",
        "--poll-interval",
        "0.1",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while manifest_lines(b) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert drain.poll() is None, "the drain daemon runs on, idle"
        code, err = collect("--into", str(into), "--final", *hosts)
        assert code == 0, err
        assert "collected 3 new sample(s)" in err
        assert _indices(into) == sorted([*fleet.samples, *range(1, 30, 3)])
        assert left.keys() <= set(_indices(into))
    finally:
        drain.terminate()
        drain.wait(60)


def test_a_move_refuses_a_host_whose_output_lock_a_process_holds(fleets, collect, tmp_path):
    fleet, into = fleets("speculators").copy(tmp_path / "hosts"), tmp_path / "collected"
    with collected_set_lock(fleet.hosts["c"]):  # the lock a drain of the output holds while it runs
        code, err = collect("--into", str(into), "--move", *fleet.args())
    assert code == 3
    assert (
        f"host c ({fleet.hosts['c']}) refused for --move: a drain runs on it (a process holds its lock "
        "(.hsextract/output.lock)); stop it first" in err
    )
    assert _indices(into) == _of_hosts(fleet, "a", "b")
    assert list((fleet.hosts["c"] / "hidden_states").glob("hs_*.safetensors")), "c's files stay"


def test_a_collect_into_a_set_another_collect_holds_is_refused_naming_it(fleets, tmp_path):
    fleet, into = fleets("speculators"), tmp_path / "collected"
    with collected_set_lock(into):
        r = hsextract("collect", "--into", str(into), *fleet.args())
    assert r.returncode == 75
    assert f"hsextract collect: error: the collected set {into} is in use by hsextract collect (pid " in r.stderr
    assert not (into / "manifest.jsonl").exists()


def test_link_across_filesystems_is_refused_before_anything_is_written(fleets, collect, tmp_path):
    fleet = fleets("speculators")
    with small_volume(tmp_path / "other-fs", "16m") as mnt:
        code, err = collect("--into", str(mnt / "collected"), "--link", *fleet.args())
        assert code == 2
        assert "--link: host a's output" in err and "is on another filesystem than the collected set" in err
        assert "Collect without --link (a copy)" in err
        assert not (mnt / "collected" / "manifest.jsonl").exists()


def test_a_full_collector_volume_stops_with_the_numbers_and_a_rerun_finishes_with_nothing_lost(
    fleets, collect, tmp_path
):
    fleet = fleets("speculators")
    with small_volume(tmp_path / "small", "80k") as mnt:
        into = mnt / "collected"
        code, err = collect("--into", str(into), *fleet.args())
        assert code == 5
        line = next(x for x in err.splitlines() if "volume is full" in x)
        assert f"the collected set's volume is full: {into} has " in line and "bytes free" in line
        assert "sample(s)," in line and "bytes, still to fetch" in line and "run collect again" in line
        partial = [e.dataset_index for e in iter_entries(into)]
        assert partial == sorted(fleet.samples)[: len(partial)] and 0 < len(partial) < len(fleet.samples)
        resize(mnt, "16m")
        code, err = collect("--into", str(into), *fleet.args())
        assert code == 0, err
        assert _indices(into) == sorted(fleet.samples)
        assert all(verify_entry(into, e) is None for e in iter_entries(into))


def test_a_full_collector_volume_is_waited_out_with_wait_for_space(fleets, tmp_path):
    fleet = fleets("speculators")
    with small_volume(tmp_path / "small", "80k") as mnt:
        into = mnt / "collected"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hsextract",
                "collect",
                "--into",
                str(into),
                "--wait-for-space",
                "0.2",
                *fleet.args(),
            ],
            env=env(),
            stderr=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                if "volume is full" in line:
                    assert "retrying every 0.2 s" in line
                    break
            else:
                pytest.fail("collect never said the volume was full")
            assert proc.poll() is None, "it waits instead of stopping"
            resize(mnt, "16m")
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0
        assert json.loads(out.splitlines()[-1])["samples"] == len(fleet.samples)
        assert _indices(into) == sorted(fleet.samples)
