"""Request ids and sample records: how the client, capture and drain agree on a sample."""

from __future__ import annotations

import json
import multiprocessing

import pytest
from hsextract.errors import ConfigError, StagingError
from hsextract.output.run_id import load_or_create_run_id
from hsextract.staging.records import (
    SampleRecord,
    check_prefix,
    make_rid,
    parse_rid,
    read_record,
    write_record,
)


def test_rid_round_trips_and_foreign_rids_do_not_parse():
    rid = make_rid("hsx", "0123abcd", 42)
    parsed = parse_rid(rid)
    assert parsed is not None and (parsed.prefix, parsed.run_id, parsed.index) == ("hsx", "0123abcd", 42)
    assert parse_rid("HEALTH_CHECK_9f0e1d2c3b4a") is None
    assert parse_rid("9cb8f00d2e6b4c1f8a3e") is None


def test_health_check_prefix_is_refused():
    with pytest.raises(ConfigError, match="HEALTH_CHECK"):
        check_prefix("HEALTH_CHECK")
    with pytest.raises(ConfigError):
        check_prefix("bad prefix")


def test_record_is_written_atomically_and_read_back(tmp_path):
    rec = SampleRecord(rid="hsx-0123abcd-7", index=7, input_ids=[1, 2, 3], loss_mask=[0, 1, 1], run_id="0123abcd")
    write_record(tmp_path, rec)
    assert read_record(tmp_path, rec.rid) == rec
    assert read_record(tmp_path, "hsx-0123abcd-8") is None
    assert [p.name for p in (tmp_path / "_records").iterdir()] == ["hsx-0123abcd-7.json"]


def test_record_with_mismatched_mask_is_refused(tmp_path):
    with pytest.raises(StagingError, match="3 input ids but 2 loss-mask values"):
        write_record(tmp_path, SampleRecord(rid="hsx-0123abcd-1", index=1, input_ids=[1, 2, 3], loss_mask=[1, 1]))


def _run_id(path, queue):
    queue.put(load_or_create_run_id(path))


def test_run_id_is_created_once_even_when_client_and_drain_start_together(tmp_path):
    queue = multiprocessing.get_context("fork").Queue()
    procs = [multiprocessing.get_context("fork").Process(target=_run_id, args=(tmp_path, queue)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    ids = {queue.get(timeout=5) for _ in procs}
    assert len(ids) == 1
    assert json.loads((tmp_path / "run.json").read_text())["run_id"] == ids.pop()


def test_records_temporaries_of_dead_writers_are_removed_and_a_live_ones_are_kept(tmp_path):
    """A client killed mid-write leaves a hidden temporary in the records directory; the next
    process that writes records there removes it (once, not at every write) and keeps another live
    process's."""
    import os
    import subprocess

    from hsextract import durable

    records = tmp_path / "_records"
    records.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = records / f".hsx-ab12cd34-7.json.{durable._HOST}.{dead.pid}.1.1.tmp"
    live = records / f".hsx-ab12cd34-8.json.{durable._HOST}.{os.getppid()}.1.1.tmp"
    orphan.write_text("{")
    live.write_text("{")
    write_record(tmp_path, SampleRecord("hsx-ab12cd34-0", 0, [1, 2], [0, 1], run_id="ab12cd34"))
    assert not orphan.exists() and live.exists()
    assert read_record(tmp_path, "hsx-ab12cd34-0").input_ids == [1, 2]


def test_a_record_is_written_again_whole_after_its_directory_was_removed(tmp_path):
    import shutil

    write_record(tmp_path, SampleRecord("hsx-ab12cd34-0", 0, [1, 2], [0, 1], run_id="ab12cd34"))
    shutil.rmtree(tmp_path / "_records")
    write_record(tmp_path, SampleRecord("hsx-ab12cd34-1", 1, [3], [1], run_id="ab12cd34"))
    assert read_record(tmp_path, "hsx-ab12cd34-1").input_ids == [3]
