"""`hsextract fleet status`: every host's `hsextract status --json` as one table, its totals and the
fleet's reconciliation."""

from __future__ import annotations

import pytest
from hsextract.fleet.status import HostStatus, fleet_status, render
from hsextract.fleet.status_input import host_statuses
from support.fleet_reports import status


def test_two_finished_hosts_make_one_table_whose_fleet_row_sums_them_and_whose_accounts_add_up():
    fs = fleet_status("gpu", [HostStatus("a", status()), HostStatus("b", status(in_set=9, failed=0))])
    assert fs.ok
    lines = render(fs)
    assert lines[0] == "fleet gpu: 2 hosts"
    assert lines[1].split() == ["host", "state", "samples", "tokens", "rate", "ETA", "failed", "quarantined"]
    assert lines[2].split() == ["a", "done", "8", "of", "9", "800", "0", "tok/s", "done", "1", "0"]
    assert lines[4].split() == ["fleet", "done", "17", "of", "18", "1,600", "0", "tok/s", "done", "1", "0"]
    assert lines[5:] == [
        "  fleet: 20 dataset lines = 18 accepted + 2 rejected",
        "  fleet: 18 accepted = 17 in the hosts' sets + 1 failed + 0 quarantined",
    ]


def test_a_running_fleet_shows_each_hosts_rate_and_the_slowest_hosts_eta():
    fs = fleet_status(
        "gpu",
        [
            HostStatus("a", status(state="running", in_set=3, on_the_way=5, eta=60.0)),
            HostStatus("b", status(state="running", in_set=5, on_the_way=3, eta=600.0)),
        ],
    )
    t = fs.totals()
    assert (t["tokens_per_s"], t["eta_s"], t["done"]) == (100.0, 600.0, False)
    assert render(fs)[-1] == "  fleet: 18 accepted = 8 in the hosts' sets + 2 failed + 0 quarantined + 8 on the way"


def test_an_unreachable_host_is_a_row_that_says_so_and_keeps_the_fleet_from_being_ok():
    fs = fleet_status("gpu", [HostStatus("a", status()), HostStatus("b", None, "unreachable: timed out")])
    assert not fs.ok and fs.problems == ["host b: unreachable: timed out"]
    assert render(fs)[3].split()[:3] == ["b", "unreachable:", "timed"]
    assert fs.reconciliation()["hosts_reporting"] == 1


def test_shards_that_do_not_add_up_to_the_dataset_are_a_problem():
    fs = fleet_status("gpu", [HostStatus("a", status(lines=10)), HostStatus("b", status(lines=9, in_set=7))])
    assert fs.problems == [
        "the hosts' shards hold 19 lines of a 20-line dataset: a shard is missing or taken twice "
        "(hsextract fleet plan says which)"
    ]


BAD_STATUSES = [
    (None, "host b: its entry is null, not an object with status and error"),
    ("oops", "host b: its entry is a string, not an object with status and error"),
    ({"status": "oops"}, "host b: its status is a string, not the object of `hsextract status --json`"),
    ({"status": {}}, "host b: its status's ok is null, not true or false"),
    ({"status": {**status(), "drain": []}}, "host b: its status's drain is a list, not an object"),
    (
        {"status": {**status(), "accounts": {**status()["accounts"], "in_set": "8"}}},
        'host b: its status\'s accounts.in_set is "8", not a count (or counts by reason)',
    ),
]


@pytest.mark.parametrize(
    ("entry", "problem"),
    BAD_STATUSES,
    ids=["null", "string", "status-string", "status-empty", "drain-list", "count-string"],
)
def test_a_malformed_host_entry_is_a_bad_entry_row_and_one_problem_naming_the_host_and_the_field(entry, problem):
    fs = fleet_status("gpu", host_statuses({"a": {"status": status()}, "b": entry}))
    assert fs.problems == [problem]
    assert render(fs)[3].split()[:3] == ["b", "bad", "entry"]
