"""The run's status files typed (hsextract.output.run_files): what the client, the drain and collect
write reads back as it was, files of older versions (keys missing, keys unknown, a hand-edited
value) are read as before and written back unchanged, and the client's pauses are one bookkeeping."""

from __future__ import annotations

import json

import pytest
from hsextract.client import progress
from hsextract.client.start_state import record_unstarted
from hsextract.collect.bookkeeping import write_fleet_client_files
from hsextract.drain.metrics import DrainStats, write_status
from hsextract.output.client_files import combined_status, read_shards
from hsextract.output.layout import client_status_path, client_summary_path, drain_status_path
from hsextract.output.run_files import (
    ClientStatus,
    ClientSummary,
    DrainStatus,
    read_drain_status,
    read_json_object,
    write_client_status,
)
from hsextract.shard import WHOLE, Shard


def _written(path) -> dict:
    return json.loads(path.read_text())


def test_what_the_writers_write_reads_back_as_it_was(tmp_path):
    stats = progress.RunStats(shard=Shard(1, 4), samples_total=5, dataset_lines=20)
    stats.record_failed("capture_failed")
    for record, kind in ((stats.status(), ClientStatus), (stats.summary_record(), ClientSummary)):
        data = record.to_json()
        assert kind.from_json(data).to_json() == data
        assert data["shard"] == [1, 4]
    drain = DrainStats(format="specforge", finalized_samples=None).snapshot()
    assert drain["finalized_samples"] is None and "objectstore" not in drain
    assert DrainStatus.from_json(drain).to_json() == drain


def test_the_client_status_keeps_its_keys():
    keys = {
        "state",
        "samples_total",
        "sent",
        "ok",
        "skipped",
        "truncated",
        "failed",
        "rejected",
        "failed_by_reason",
        "rejected_by_reason",
        "retried_by_reason",
        "in_flight",
        "awaiting_capture",
        "tokens",
        "tokens_per_s",
        "eta_s",
        "paused_reason",
        "paused_s",
        "paused_for_s",
        "error",
        "shard",
        "attempt",
        "pid",
        "started_at",
        "updated_at",
    }
    assert set(progress.RunStats().snapshot()) == keys
    assert set(progress.RunStats().summary()) == {
        "state",
        "samples_total",
        "dataset_lines",
        "shard",
        "ok",
        "skipped",
        "truncated",
        "failed",
        "rejected",
        "retried",
        "tokens",
        "wall_s",
        "paused_s",
        "startup_s",
        "attempt",
        "finished_at",
    }


@pytest.mark.parametrize(
    "data",
    [
        {"state": "done", "sent": 4},  # an older client's, or one written by hand
        {"state": "running", "eta_s": None, "shard": [0, 2], "ok": "3", "error": None, "from_the_future": {"a": 1}},
        {},
    ],
)
def test_an_older_or_odd_file_is_written_back_as_it_was_read(tmp_path, data):
    status = ClientStatus.from_json(data)
    assert status.to_json() == data
    path = tmp_path / "client-status.json"
    write_client_status(path, status)
    assert _written(path) == data


def test_a_value_of_a_type_no_version_writes_is_not_taken_as_its_field():
    status = ClientStatus.from_json({"ok": "3", "sent": True, "shard": "nonsense", "eta_s": None})
    assert status.ok is None and status.sent is None and status.shard is None
    assert status.has("eta_s") and not status.has("paused_for_s")
    assert ClientStatus.from_json({"shard": "1/2"}).shard == Shard(1, 2)


def test_a_null_is_told_from_a_missing_key():
    assert DrainStatus.from_json({"finalized_samples": None}).has("finalized_samples")
    assert not DrainStatus.from_json({"state": "running"}).has("finalized_samples")
    assert DrainStatus.from_json({"finalized_samples": 3}).has("finalized_samples")


def test_read_json_object_is_none_for_anything_but_an_object(tmp_path):
    assert read_json_object(tmp_path / "missing.json") is None
    for text in ("{torn", "[1, 2]", "3", ""):
        (tmp_path / "f.json").write_text(text)
        assert read_json_object(tmp_path / "f.json") is None
    (tmp_path / "f.json").write_text('{"a": 1}')
    assert read_json_object(tmp_path / "f.json") == {"a": 1}
    assert ClientSummary.read(tmp_path / "missing.json") is None


def test_the_drain_writes_its_status_with_its_process_s_own_keys(tmp_path):
    stats = DrainStats(state="running", objectstore={"url": "s3://b/p"})
    write_status(tmp_path, stats, pid=7, dump_dir="/d", quarantine_dir="/q", error="boom")
    status = read_drain_status(tmp_path)
    assert status is not None and (status.pid, status.dump_dir, status.quarantine_dir, status.error) == (
        7,
        "/d",
        "/q",
        "boom",
    )
    assert _written(drain_status_path(tmp_path))["objectstore"] == {"url": "s3://b/p"}


def test_a_whole_dataset_file_of_an_older_client_names_its_shard_inside(tmp_path):
    path = client_summary_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"state": "done", "dataset_lines": 10, "shard": [1, 2]}))
    (shard,) = read_shards(tmp_path)
    assert shard.shard == Shard(1, 2) and shard.summary is not None and shard.summary.dataset_lines == 10
    assert shard.summary_id and shard.summary_id.startswith("file:")


def test_one_client_s_combined_status_is_its_file(tmp_path):
    path = client_status_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"state": "done", "sent": 4}))
    assert combined_status(read_shards(tmp_path)) == {"state": "done", "sent": 4}


@pytest.mark.parametrize("final", [False, True])
def test_collect_writes_its_client_file_as_before(tmp_path, final):
    (tmp_path / ".hsextract").mkdir()
    hosts = {"a": [[0, 2]], "b": [[1, 2]]}
    write_fleet_client_files(tmp_path, 10, final, hosts)
    path = client_summary_path(tmp_path) if final else client_status_path(tmp_path)
    body = {
        "state": "done" if final else "collecting",
        "dataset_lines": 10,
        "shard": WHOLE.to_json(),
        "collected_from": hosts,
    }
    assert path.read_bytes() == (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()
    mtime = path.stat().st_mtime_ns
    write_fleet_client_files(tmp_path, 10, final, hosts)
    assert path.stat().st_mtime_ns == mtime, "a collect that adds nothing rewrites nothing"


def test_a_refused_start_puts_the_last_status_back_with_its_refusal(tmp_path):
    path = client_status_path(tmp_path)
    path.parent.mkdir(parents=True)
    previous = {"state": "done", "sent": 4, "start_refused": {"error": "old", "at": 1.0, "pid": 1}}
    path.write_text(json.dumps(previous))
    record_unstarted(tmp_path, WHOLE, ClientStatus.read(path), progress.RunStats().status(), "no server")
    status = _written(path)
    assert {k: v for k, v in status.items() if k != "start_refused"} == {"state": "done", "sent": 4}
    assert status["start_refused"]["error"] == "no server"
    record_unstarted(tmp_path, WHOLE, ClientStatus.read(path), progress.RunStats().status(), None)
    assert _written(path) == {"state": "done", "sent": 4}


def test_every_wait_is_one_pause_that_ends_with_its_block(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    stats = progress.RunStats()
    with pytest.raises(RuntimeError), stats.paused("waiting for the server") as still:
        now[0] += 2.0
        still("the server again")
        assert stats.snapshot()["paused_reason"] == "the server again"
        assert stats.snapshot()["paused_for_s"] == 2.0
        raise RuntimeError("a stop while it waits")
    snap = stats.snapshot()
    assert snap["paused_reason"] is None and snap["paused_for_s"] is None and snap["paused_s"] == 2.0
    stats.pause_begins("staging full")
    now[0] += 1.0
    stats.finish("stopped")
    assert stats.snapshot()["state"] == "stopped" and stats.summary()["paused_s"] == 3.0
