"""`hsextract fleet plan`: every host's own plan judged as one run, before anything starts."""

from __future__ import annotations

import pytest
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
    assert lines[-1] == (
        "  the shards cover the dataset exactly once; every planned host reads it and can hold its shard"
    )


def test_a_shard_no_host_takes_is_a_problem_naming_the_shard_and_its_first_indices():
    plan = plan_fleet("gpu", planned(("a", "0/3"), ("b", "1/3")))
    assert plan.problems == [
        "the hosts' shards do not cover the dataset: shard 2/3 is taken by no host (dataset indices 2, 5, 8, 11 ...)"
    ]


def test_two_hosts_of_one_shard_are_a_problem_naming_both():
    plan = plan_fleet("gpu", planned(("a", "0/2"), ("b", "0/2")))
    assert (
        "the hosts' shards overlap: dataset index 0 (and each 2 later) is in the shards of a (0/2) and b (0/2)"
        in plan.problems
    )


def test_a_host_that_cannot_hold_its_shard_stops_the_fleet_with_its_own_numbers():
    hosts = planned(("a", "0/2"))
    hosts.append(
        HostPlan("b", "1/2", report("1/2", ok=False), 5, "/data/out has 1.0 KiB free, but the run needs 9 MiB")
    )
    plan = plan_fleet("gpu", hosts)
    assert plan.no_room
    assert plan.problems == ["host b cannot hold its shard 1/2: /data/out has 1.0 KiB free, but the run needs 9 MiB"]


def test_a_host_reading_another_dataset_is_a_problem_naming_it_and_the_reference_host():
    other = {**FINGERPRINT, "files": [{"name": None, "bytes": 900, "sha256": "cd" * 32}]}
    hosts = [*planned(("a", "0/2")), HostPlan("b", "1/2", report("1/2", fingerprint=other, dataset="/old.jsonl"), 0)]
    plan = plan_fleet("gpu", hosts)
    assert plan.problems == [
        "host b reads another dataset than host a: /old.jsonl differs from /data/train.jsonl in "
        "its first bytes (dataset fingerprint). Every host of a fleet must read the same dataset: "
        "copy the same file to each (hsextract_dataset_src)"
    ]


def test_a_host_with_a_copy_cut_short_is_a_problem_with_both_row_counts():
    hosts = [*planned(("a", "0/2")), HostPlan("b", "1/2", report("1/2", rows=20), 0)]
    (problem,) = plan_fleet("gpu", hosts).problems
    assert problem.startswith("host b reads 20 rows of /data/train.jsonl, host a 30 of /data/train.jsonl")


def test_an_unreachable_host_is_a_note_not_a_problem_and_its_shard_still_counts_for_the_coverage():
    hosts = [*planned(("a", "0/2")), HostPlan("b", "1/2")]
    plan = plan_fleet("gpu", hosts)
    assert plan.problems == []
    assert plan.notes == [
        "host b: not planned (unreachable, or it failed before its plan); its shard 1/2 waits until "
        "the play runs again with it"
    ]


# -- what the controller hands over, however it is malformed ----------------------------------------


def fleet_plan(tmp_path, capsys, hosts: dict) -> tuple[int, list[str]]:
    """``hsextract fleet plan`` in this process on `hosts`: (exit status, the lines it printed)."""
    import json

    from hsextract.cli import main

    source = tmp_path / "plans.json"
    source.write_text(json.dumps({"group": "gpu", "hosts": hosts}))
    capsys.readouterr()
    code = main(["fleet", "plan", str(source)])
    return code, capsys.readouterr().out.splitlines()


def good(shard: str) -> dict:
    return {"shard": shard, "report": report(shard), "rc": 0, "error": ""}


MALFORMED = [
    (None, "host b: its entry is null, not an object with shard, report, rc and error"),
    (["1/2", 0], "host b: its entry is a list, not an object with shard, report, rc and error"),
    (
        {"shard": "1/2", "report": "oops", "rc": 0},
        "host b: its report is a string, not the object of `hsextract plan --json`",
    ),
    (
        {"shard": "1/2", "report": {}, "rc": 0},
        "host b: its report lacks dataset, shard, format, rows, samples, tokens, remaining_tokens, "
        "dataset_fingerprint, formats, output_volume",
    ),
    (
        {"shard": "1/2", "report": {**report("1/2"), "samples": "ten"}, "rc": 0},
        'host b: its report\'s samples is "ten", not a count',
    ),
    (
        {"shard": "1/2", "report": {**report("1/2"), "formats": {}}, "rc": 0},
        'host b: its report\'s formats has no entry for its format "speculators"',
    ),
    ({"shard": "1/2", "report": None, "rc": "x", "error": "boom"}, 'host b: its rc is "x", not an exit status'),
    (
        {"shard": "one of two", "report": report("1/2"), "rc": 0},
        "host b: shard 'one of two': expected i/n, e.g. 0/4 for the first of four hosts",
    ),
]


@pytest.mark.parametrize(
    ("entry", "problem"),
    MALFORMED,
    ids=["null", "list", "report-string", "report-empty", "count-string", "format-missing", "rc-string", "shard"],
)
def test_a_malformed_host_entry_is_one_problem_naming_the_host_and_the_field_and_exits_3(
    tmp_path, capsys, entry, problem
):
    code, lines = fleet_plan(tmp_path, capsys, {"a": good("0/2"), "b": entry})
    assert code == 3
    assert [line for line in lines if line.startswith("  PROBLEM ")] == [f"  PROBLEM {problem}"]


def test_a_host_whose_rc_says_no_room_exits_5_even_as_a_string(tmp_path, capsys):
    code, lines = fleet_plan(
        tmp_path,
        capsys,
        {"a": good("0/2"), "b": {"shard": "1/2", "report": None, "rc": "5", "error": "/out has 1 KiB free"}},
    )
    assert code == 5
    assert "  PROBLEM host b cannot hold its shard 1/2: /out has 1 KiB free" in lines


def test_a_report_of_another_shard_than_the_controller_gave_is_a_problem_naming_both():
    hosts = [HostPlan("a", "0/2", report("0/1", samples=30), 0), HostPlan("b", "1/2", report("0/1", samples=30), 0)]
    plan = plan_fleet("gpu", hosts)
    assert plan.problems == [
        "host a: its plan sized shard 0/1, but the controller gave it shard 0/2: its numbers are not its share; "
        "plan it again with its shard (hsextract_shard)",
        "host b: its plan sized shard 0/1, but the controller gave it shard 1/2: its numbers are not its share; "
        "plan it again with its shard (hsextract_shard)",
    ]


def test_a_report_of_the_same_shard_written_otherwise_is_not_a_mismatch():
    plan = plan_fleet("gpu", [HostPlan("a", "", report("0/1"), 0)])
    assert plan.problems == []


def test_a_plan_that_exited_0_without_a_report_is_a_problem_not_a_silent_pass():
    plan = plan_fleet("gpu", [*planned(("a", "0/2")), HostPlan("b", "1/2", None, 0)])
    assert plan.problems == [
        "host b: its plan exited 0 but no report of it came back, so its room and its dataset are not checked"
    ]
