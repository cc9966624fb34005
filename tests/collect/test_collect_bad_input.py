"""Bad input to hsextract collect: one clear line each, the other hosts still collected, nothing
already collected lost. A wrong path, a host of another dataset or other layers, a missing host,
a host a drain still writes, a set another collect holds, a full collector volume, a hard link
across filesystems."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from hsextract.collect.lock import collected_set_lock
from hsextract.formats.manifest import iter_entries, verify_entry
from support.drain_proc import env, hsextract, start
from support.fleet import make_fleet, snapshot, three_hosts, write_dataset
from support.volumes import resize, small_volume

pytestmark = pytest.mark.timeout(300)


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
    other = make_fleet(tmp_path / "other", "speculators", three_hosts()[1:2], 30,
                       dataset=write_dataset(tmp_path / "other.jsonl", 30, tag="other "))
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
    assert (f"host c ({fleet.hosts['c']}) refused: layers (eagle convention) is [1, 2, 4], expected [1, 3, 4] "
            "(as host a has it)") in err


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


def test_a_final_collect_refuses_a_host_a_drain_still_writes_and_a_plain_one_takes_what_it_committed(fleets, collect,
                                                                                                        tmp_path):
    fleet = fleets("speculators").copy(tmp_path / "hosts")
    dump = tmp_path / "dump-b"
    dump.mkdir()
    drain = start("drain", "--dump-dir", str(dump), "--output", str(fleet.hosts["b"]), "--format", "speculators",
                  "--poll-interval", "0.1", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        status = fleet.hosts["b"] / ".hsextract" / "drain-status.json"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if status.exists() and json.loads(status.read_text()).get("pid") == drain.pid:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the drain never wrote its status")
        into = tmp_path / "collected"
        code, err = collect("--into", str(into), "--final", *fleet.args())
        assert code == 3
        assert f"host b ({fleet.hosts['b']}) refused for --final: a drain still writes it (its drain's status says" \
               in err
        assert _indices(into) == _of_hosts(fleet, "a", "c")
        code, err = collect("--into", str(into), *fleet.args())
        assert code == 0, err
        assert _indices(into) == sorted(fleet.samples)
    finally:
        drain.terminate()
        drain.wait(60)


def test_a_final_collect_refuses_a_host_whose_output_lock_a_process_holds(fleets, collect, tmp_path):
    fleet, into = fleets("speculators").copy(tmp_path / "hosts"), tmp_path / "collected"
    with collected_set_lock(fleet.hosts["c"]):  # the lock a drain of the output holds while it writes
        code, err = collect("--into", str(into), "--final", *fleet.args())
    assert code == 3
    assert "host c (" in err and "refused for --final: a drain still writes it (a process holds its lock " \
        "(.hsextract/output.lock))" in err
    assert _indices(into) == _of_hosts(fleet, "a", "b")


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


def test_a_full_collector_volume_stops_with_the_numbers_and_a_rerun_finishes_with_nothing_lost(fleets, collect,
                                                                                                 tmp_path):
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
            [sys.executable, "-m", "hsextract", "collect", "--into", str(into), "--wait-for-space", "0.2",
             *fleet.args()],
            env=env(), stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
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

