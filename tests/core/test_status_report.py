"""``hsextract status --json`` as a record (hsextract.status_report): the object it prints keeps its
keys, their order and their values, and the fleet's status reads it."""

from __future__ import annotations

import json
from pathlib import Path

from hsextract.cli import main
from hsextract.fleet.status_input import status_problem
from hsextract.output.accounts import reconcile
from hsextract.output.run_files import DrainStatus
from hsextract.status_report import StatusReport

NOW = 1_700_000_000.0


def write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_the_object_has_the_keys_in_their_order_and_nulls_where_nothing_is_known():
    empty = StatusReport(False, "no drain status file (is the drain running?)", [], None, None, None, None, None)
    assert empty.to_json() == {
        "ok": False,
        "why": "no drain status file (is the drain running?)",
        "problems": [],
        "drain": None,
        "client": None,
        "dataset_lines": None,
        "accounts": None,
        "commits": None,
        "dataset_files": None,
    }
    accounts = reconcile(range(3), {}, {0, 1, 2}, {}, {}, set(), final=True)
    drain = DrainStatus.from_json({"state": "done", "samples_total": 3})
    data = StatusReport(True, "drain done", [], drain, {"state": "done"}, 3, accounts, (3, 3)).to_json()
    assert list(data) == list(empty.to_json())
    assert data["drain"] == {"state": "done", "samples_total": 3} and data["accounts"] == accounts.as_dict()
    assert data["dataset_files"] == {"samples": 3, "of": 3, "current": True}
    assert status_problem(json.loads(json.dumps(data))) == ""


def test_status_json_prints_the_object_it_printed_before_it_was_a_record(tmp_path, monkeypatch, capsys):
    """A finished client and drain whose dataset-level files are behind the set, with a reject."""
    import hsextract.status

    out = tmp_path / "out"
    write(out / "run.json", {"run_id": "r1"})
    drain = {"state": "done", "format": "speculators", "samples_total": 3, "lag": 0, "in_flight": 0}
    write(out / ".hsextract" / "drain-status.json", {**drain, "finalized_samples": 2, "updated_at": NOW - 100})
    summary = {"state": "done", "samples_total": 4, "dataset_lines": 4, "shard": [0, 1], "ok": 3}
    write(out / ".hsextract" / "client-summary.json", summary)
    client = {"state": "done", "samples_total": 4, "sent": 4, "ok": 3, "shard": [0, 1], "eta_s": None}
    write(out / ".hsextract" / "client-status.json", {**client, "tokens_per_s": 12.5})
    write(out / ".hsextract" / "finalized.json", {"samples": 2})
    reject = {"index": 3, "line": 4, "file": "t.jsonl", "reason": "empty_turn"}
    (out / ".hsextract" / "rejects.jsonl").write_text(json.dumps(reject) + "\n")
    monkeypatch.setattr(hsextract.status.time, "time", lambda: NOW)
    capsys.readouterr()

    assert main(["status", "--output", str(out), "--json"]) == 1
    printed = capsys.readouterr().out
    expected = {
        "ok": False,
        "why": "drain done 1 min 40 s ago",
        "problems": [
            "3 accepted sample(s) are in neither the training set, the failures nor the quarantine (dataset "
            "indices 0, 1, 2): this is a bug, please report it",
            "the dataset-level files (the format's, the draft vocabulary's) cover 2 of the 3 samples in the set, "
            f"so a trainer would not read the others: run `hsextract finalize --output {out}`",
        ],
        "drain": {**drain, "finalized_samples": 2, "updated_at": NOW - 100},
        # The client's status in the order of hsextract.output.run_files.ClientStatus's fields.
        "client": {
            "state": "done",
            "samples_total": 4,
            "sent": 4,
            "ok": 3,
            "tokens_per_s": 12.5,
            "eta_s": None,
            "shard": [0, 1],
        },
        "dataset_lines": 4,
        "accounts": {
            "lines": 4,
            "accepted": 3,
            "rejected": {"empty_turn": 1},
            "in_set": 0,
            "failed": {},
            "quarantined": {},
            "on_the_way": 0,
            "unaccounted": [0, 1, 2],
            "final": True,
        },
        "commits": {
            "samples": 0,
            "commits": 0,
            "first_at": None,
            "last_at": None,
            "client_end_at": None,
            "after_client_end": {"samples": 0, "commits": 0, "last_s": None},
            "tail": False,
            "selfcheck_queue": None,
        },
        "dataset_files": {"samples": 2, "of": 3, "current": False},
    }
    assert printed == json.dumps(expected, indent=2) + "\n"
