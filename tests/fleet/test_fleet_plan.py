"""`hsextract fleet plan`: every host's own plan judged as one run, before anything starts."""

from __future__ import annotations

from hsextract.fleet.plan import HostPlan, plan_fleet, render
from support.fleet_reports import FINGERPRINT, report


def planned(*names_shards: tuple[str, str], **kw) -> list[HostPlan]:
    return [HostPlan(n, s, report(s, **kw), 0) for n, s in names_shards]


def test_hosts_that_cover_the_dataset_and_read_one_dataset_plan_as_one_run_with_its_totals():
    plan = plan_fleet("gpu", planned(("a", "0/3"), ("b", "1/3"), ("c", "2/3")))
    assert plan.problems == [] and plan.notes == []
    totals = plan.totals()
    assert (totals["samples"], totals["tokens"], totals["remaining_bytes"]) == (30, 3000, 30_000_000)
    assert totals["seconds"] == 3600.0, "the hosts extract at once: the fleet takes its slowest host's time"
    lines = render(plan)
    assert lines[0] == "fleet plan: 3 hosts of group gpu, dataset /data/train.jsonl (30 rows)"
    assert lines[-1] == ("  the shards cover the dataset exactly once; every planned host reads it and can hold its "
                         "shard")


def test_a_shard_no_host_takes_is_a_problem_naming_the_shard_and_its_first_indices():
    plan = plan_fleet("gpu", planned(("a", "0/3"), ("b", "1/3")))
    assert plan.problems == ["the hosts' shards do not cover the dataset: shard 2/3 is taken by no host "
                             "(dataset indices 2, 5, 8, 11 ...)"]


def test_two_hosts_of_one_shard_are_a_problem_naming_both():
    plan = plan_fleet("gpu", planned(("a", "0/2"), ("b", "0/2")))
    assert "the hosts' shards overlap: dataset index 0 (and each 2 later) is in the shards of a (0/2) and b (0/2)" \
        in plan.problems


def test_a_host_that_cannot_hold_its_shard_stops_the_fleet_with_its_own_numbers():
    hosts = planned(("a", "0/2"))
    hosts.append(HostPlan("b", "1/2", report("1/2", ok=False), 5,
                          "/data/out has 1.0 KiB free, but the run needs 9 MiB"))
    plan = plan_fleet("gpu", hosts)
    assert plan.no_room
    assert plan.problems == ["host b cannot hold its shard 1/2: /data/out has 1.0 KiB free, but the run needs 9 MiB"]


def test_a_host_reading_another_dataset_is_a_problem_naming_it_and_the_reference_host():
    other = {**FINGERPRINT, "files": [{"name": None, "bytes": 900, "sha256": "cd" * 32}]}
    hosts = [*planned(("a", "0/2")), HostPlan("b", "1/2", report("1/2", fingerprint=other, dataset="/old.jsonl"), 0)]
    plan = plan_fleet("gpu", hosts)
    assert plan.problems == ["host b reads another dataset than host a: /old.jsonl differs from /data/train.jsonl in "
                             "its first bytes (dataset fingerprint). Every host of a fleet must read the same dataset: "
                             "copy the same file to each (hsextract_dataset_src)"]


def test_a_host_with_a_copy_cut_short_is_a_problem_with_both_row_counts():
    hosts = [*planned(("a", "0/2")), HostPlan("b", "1/2", report("1/2", rows=20), 0)]
    (problem,) = plan_fleet("gpu", hosts).problems
    assert problem.startswith("host b reads 20 rows of /data/train.jsonl, host a 30 of /data/train.jsonl")


def test_an_unreachable_host_is_a_note_not_a_problem_and_its_shard_still_counts_for_the_coverage():
    hosts = [*planned(("a", "0/2")), HostPlan("b", "1/2")]
    plan = plan_fleet("gpu", hosts)
    assert plan.problems == []
    assert plan.notes == ["host b: not planned (unreachable, or it failed before its plan); its shard 1/2 waits until "
                          "the play runs again with it"]
