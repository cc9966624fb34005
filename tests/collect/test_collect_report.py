"""The collect report as a record (hsextract.collect.report_file): its file has the bytes of the dict
before it, key for key, and a report an earlier version wrote without a key is still read."""

from __future__ import annotations

import json

import pytest
from hsextract.collect.report_file import CollectedHost, CollectReport, read_collect_report, write_collect_report
from hsextract.output.accounts import reconcile
from hsextract.output.layout import collect_report_path
from hsextract.shard import Shard

FAILED = {
    "index": 13,
    "rid": "r1-13",
    "reason": "checksum_mismatch",
    "detail": "sha256:ab != sha256:cd",
    "host": "b",
    "host_index": 4,
}
# The report of a collect of two of three hosts, one refused, as hsextract.collect.report built the
# dict before it was a record: the hosts in the order given, each host's keys in the writer's order.
WRITTEN: dict = {
    "into": "/data/collected",
    "final": False,
    "samples": 17,
    "hosts": {
        "b": {"path": "/staging/b", "shards": [[1, 3]], "samples_in_host": 9, "collected": 8, "finished": True},
        "a": {
            "path": "/staging/a",
            "shards": [[0, 6], [3, 6]],
            "samples_in_host": 9,
            "collected": 9,
            "finished": False,
        },
    },
    "refused": ["host c (/staging/c): its manifest's model differs (model_config_sha256)"],
    "duplicates": ["sample 7 of host a is dataset index 21, which host b has too: left out"],
    "failed_verification": [FAILED],
    "missing_shards": ["shard 2/3 is in no host output (dataset indices 2, 5, 8, 11 ...)"],
    "doubled_shards": [],
    "accounts": reconcile(range(30), {0: "empty_turn"}, set(range(1, 18)), {}, {}, set(), final=False).as_dict(),
}


def test_the_report_is_the_dict_it_was_key_for_key_and_byte_for_byte():
    report = CollectReport.from_json(WRITTEN)
    assert report.hosts["a"] == CollectedHost(9, False, "/staging/a", 9, [Shard(0, 6), Shard(3, 6)])
    assert report.to_json() == WRITTEN and list(report.to_json()) == list(WRITTEN)
    assert report.to_bytes() == (json.dumps(WRITTEN, indent=1, sort_keys=True) + "\n").encode()
    assert CollectReport.from_json(json.loads(report.to_bytes())) == report


def test_the_writer_writes_those_bytes_once_and_the_reader_reads_the_report_back(tmp_path):
    report = CollectReport.from_json(WRITTEN)
    collect_report_path(tmp_path).parent.mkdir(parents=True)
    assert write_collect_report(tmp_path, report) is True
    assert collect_report_path(tmp_path).read_bytes() == report.to_bytes()
    assert write_collect_report(tmp_path, report) is False, "a collect that changes nothing rewrites nothing"
    assert read_collect_report(tmp_path) == report


def test_no_report_or_one_that_is_no_object_is_no_collected_set(tmp_path):
    assert read_collect_report(tmp_path) is None
    collect_report_path(tmp_path).parent.mkdir(parents=True)
    collect_report_path(tmp_path).write_text("[]\n")
    assert read_collect_report(tmp_path) is None


@pytest.mark.parametrize("missing", list(WRITTEN))
def test_a_report_of_an_earlier_version_without_a_key_is_read_with_it_empty(missing):
    old = {k: v for k, v in WRITTEN.items() if k != missing}
    report = CollectReport.from_json(old)
    empty = {"into": "", "final": False, "samples": 0, "hosts": {}, "accounts": {}}.get(missing, [])
    assert report.to_json() == {**WRITTEN, missing: empty}


def test_a_host_of_an_earlier_version_without_its_keys_is_read_as_the_status_read_it():
    report = CollectReport.from_json({"hosts": {"a": {}}})
    assert report.hosts == {"a": CollectedHost(0, False, "", 0, [])}
    assert report == CollectReport("", False, 0, {"a": CollectedHost(0, False, "", 0, [])}, [], [], [], [], [], {})
