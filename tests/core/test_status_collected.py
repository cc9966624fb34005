"""``hsextract status`` on a set made by ``hsextract collect``, built by hand: the JSON object and the
lines it prints keep their keys, order and values now that the collect report and the status are
records (hsextract.collect.report_file, hsextract.status_report)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hsextract.cli import main
from hsextract.collect.report_file import CollectReport
from hsextract.output.layout import client_status_path, client_summary_path, collect_report_path, rejects_path
from hsextract.output.manifest import ManifestEntry, write_header
from hsextract.status_report import CollectedStatus, StatusReport
from support.manifests import tiny_header

HEADER = tiny_header(
    run_id="r1",
)
FAILED = {"index": 4, "rid": "r1-4", "reason": "checksum", "detail": "differs", "host": "b", "host_index": 1}


def _entry(i: int, x: int, host: str) -> ManifestEntry:
    return ManifestEntry(i, x, f"r1-{x}", 10 + x, f"data/{i}.safetensors", 100 + x, "sha256:00", 1.0, "", "", host, i)


def _report(final: bool) -> dict:
    """The report as hsextract.collect.report wrote it before it was a record: two hosts of three,
    one refused, one sample failed at verification."""
    return {
        "into": "/data/collected",
        "final": final,
        "samples": 3,
        "hosts": {  # in the order given to collect
            "b": {"path": "/staging/b", "shards": [[1, 3]], "samples_in_host": 2, "collected": 1, "finished": False},
            "a": {"path": "/staging/a", "shards": [[0, 3]], "samples_in_host": 2, "collected": 2, "finished": True},
        },
        "refused": ["host c (/staging/c): another model"],
        "duplicates": [],
        "failed_verification": [FAILED],
        "missing_shards": [] if final else ["shard 2/3 is in no host output (dataset indices 2, 5)"],
        "doubled_shards": [],
        "accounts": {"lines": 6},
    }


def collected_set(out: Path, final: bool) -> Path:
    """A collected set of 3 samples of a 6-line dataset, with one reject, as collect leaves it."""
    (out / ".hsextract").mkdir(parents=True)
    (out / "run.json").write_text(json.dumps({"run_id": "r1"}))
    write_header(out, HEADER)
    entries = [_entry(0, 0, "a"), _entry(1, 3, "a"), _entry(2, 1, "b")]
    (out / "manifest.jsonl").write_bytes(b"".join(e.to_line() for e in entries))
    client = {"state": "done" if final else "collecting", "dataset_lines": 6, "shard": [0, 1]}
    (client_summary_path(out) if final else client_status_path(out)).write_text(json.dumps(client))
    rejects_path(out).write_text(json.dumps({"index": 5, "reason": "empty_turn"}) + "\n")
    collect_report_path(out).write_text(json.dumps(_report(final), indent=1, sort_keys=True) + "\n")
    return out


def _status(out: Path, capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["status", "--output", str(out), "--max-failure-share", "0.5", *args])
    return code, capsys.readouterr().out


def _accounts(final: bool) -> dict:
    return {
        "lines": 6,
        "accepted": 5,
        "rejected": {"empty_turn": 1},
        "in_set": 3,
        "failed": {},
        "quarantined": {},
        "on_the_way": 0 if final else 2,
        "unaccounted": [2, 4] if final else [],
        "final": final,
    }


def test_status_json_of_a_collected_set_not_final_is_the_object_it_printed_before(tmp_path, capsys):
    out = collected_set(tmp_path / "collected", final=False)
    code, printed = _status(out, capsys, "--json")
    assert code == 0
    expected = {
        "ok": True,
        "why": "a collected set (hsextract collect), not final yet",
        "problems": [],
        "drain": None,
        "client": None,
        "dataset_lines": 6,
        "accounts": _accounts(False),
        "collected": {
            "final": False,
            "precision": "bf16",
            "samples": 3,
            "tokens": 10 + 13 + 11,
            "bytes": 100 + 103 + 101,
            # As the report file holds them: sorted, the hosts by name and each host's keys.
            "hosts": {
                "a": {"collected": 2, "finished": True, "path": "/staging/a", "samples_in_host": 2, "shards": [[0, 3]]},
                "b": {
                    "collected": 1,
                    "finished": False,
                    "path": "/staging/b",
                    "samples_in_host": 2,
                    "shards": [[1, 3]],
                },
            },
            "refused": ["host c (/staging/c): another model"],
            "missing_shards": ["shard 2/3 is in no host output (dataset indices 2, 5)"],
            "doubled_shards": [],
            "failed_verification": 1,
        },
    }
    assert printed == json.dumps(expected, indent=2) + "\n"


def test_status_json_of_a_final_collected_set_that_fails_its_check_is_the_object_it_printed_before(tmp_path, capsys):
    out = collected_set(tmp_path / "collected", final=True)
    code, printed = _status(out, capsys, "--json")
    assert code == 1
    data = json.loads(printed)
    assert list(data) == ["ok", "why", "problems", "drain", "client", "dataset_lines", "accounts", "collected"]
    assert data["ok"] is False and data["why"] == "a collected set (hsextract collect)"
    assert data["problems"] == [
        "2 accepted sample(s) are in neither the training set, the failures nor the quarantine (dataset indices "
        "2, 4): this is a bug, please report it"
    ]
    assert data["accounts"] == _accounts(True) and data["collected"]["final"] is True
    assert data["collected"]["missing_shards"] == []


def test_status_text_of_a_collected_set_is_what_it_printed_before(tmp_path, capsys):
    out = collected_set(tmp_path / "collected", final=False)
    code, printed = _status(out, capsys)
    assert code == 0
    assert printed.splitlines() == [
        "The collected set is not final yet: 3 samples from 2 hosts are in the training set; collect again with "
        "every host once each has finished.",
        f"  training set   {out} (speculators)",
        "  samples        3 in the set, collected from a (0/3): 2, b (1/3): 1, not finished",
        "  tokens         34 in the set",
        "  written        0.0 MB",
        "  last collect   host c (/staging/c): another model",
        "                 shard 2/3 is in no host output (dataset indices 2, 5)",
        "                 1 sample failed verification (listed with the failures)",
        f"  rejected       1, listed in {rejects_path(out)}",
        "                   empty_turn  1",
        "  failed         0",
        "  quarantined    0",
        "  counts         6 dataset lines = 5 accepted + 1 rejected",
        "                 5 accepted = 3 in the set + 0 failed + 0 quarantined + 2 on the way",
    ]


@pytest.mark.parametrize("missing", ["hosts", "refused", "missing_shards", "doubled_shards", "failed_verification"])
def test_a_report_of_an_earlier_version_without_a_list_is_read_as_empty(tmp_path, capsys, missing):
    out = collected_set(tmp_path / "collected", final=False)
    report = _report(False)
    del report[missing]
    collect_report_path(out).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    code, printed = _status(out, capsys, "--json")
    assert code == 0
    collected = json.loads(printed)["collected"]
    assert collected[missing] == (0 if missing == "failed_verification" else {} if missing == "hosts" else [])


def test_a_collected_sets_status_has_no_dataset_files_to_give():
    collected = CollectedStatus(3, 34, 304, CollectReport.from_json(_report(False)))
    with pytest.raises(ValueError, match="no dataset_files"):
        StatusReport(True, "a collected set (hsextract collect)", [], None, None, 6, None, (3, 3), collected)
