"""The speculators Arrow dataset follows the manifest: each finalize adds only the new rows.

A run of millions of samples has tens of GB of token ids in its Arrow dataset, so bringing it up to
date must never re-read every sample file nor rewrite every data file. What the trainer's reader
sees must still be every row, in output order, whatever mix of finalizes produced it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hsextract.drain.core import DrainConfig, Drainer
from hsextract.formats import speculators
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from support.drain_proc import finish_client
from support.reader_check import assert_reader_sees_captured, load_with_reader
from support.staged_dumps import stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _drain_session(dump: Path, out: Path, lines: int) -> None:
    """One drain process's life: drain what is staged, finalize, exit (the client sent `lines` samples)."""
    finish_client(out, lines)
    Drainer(
        DrainConfig(
            dump_dir=dump,
            output=out,
            format="speculators",
            workers=2,
            poll_interval_s=0.05,
            exit_when_done=True,
            finalize_idle_s=3600,
        )
    ).run()


def _data_files(out: Path) -> list[str]:
    return [item["filename"] for item in json.loads((out / "state.json").read_text())["_data_files"]]


def _three_sessions(tmp_path: Path) -> tuple[Path, dict, list[list[str]]]:
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    staged, files_after = {}, []
    for session in range(3):
        for i in range(session * 4, session * 4 + 4):
            staged[i] = stage_sample(dump, run, i, tokens=5 + i)
        _drain_session(dump, out, lines=len(staged))
        files_after.append(_data_files(out))
    return out, staged, files_after


def test_rows_drained_in_three_sessions_load_in_order_with_the_trainers_reader(readers, tmp_path, monkeypatch):
    monkeypatch.setattr(speculators, "TAIL_FILE_LIMIT", 0)  # every finalize starts a new data file
    out, staged, files_after = _three_sessions(tmp_path)
    assert [len(f) for f in files_after] == [1, 2, 3]
    assert files_after[2][:2] == files_after[1] and files_after[1][:1] == files_after[0]  # never rewritten
    assert sorted(p.name for p in out.glob("data-*.arrow")) == sorted(files_after[2])
    loaded = load_with_reader(readers, "speculators", out, num_aux=3, hidden=64)
    assert_reader_sees_captured("speculators", out, loaded, staged)


def test_small_data_files_take_the_new_rows_instead_of_multiplying(tmp_path):
    out, _, files_after = _three_sessions(tmp_path)
    assert [len(f) for f in files_after] == [1, 1, 1]
    assert len(list(out.glob("data-*.arrow"))) == 1


def test_a_dataset_holding_rows_the_manifest_lacks_is_rebuilt_from_the_manifest(tmp_path):
    import datasets

    out, _, _ = _three_sessions(tmp_path)
    entries = list(iter_entries(out))
    speculators.build_arrow_dataset(out, entries[:5])  # e.g. an output dir restored from an older backup
    ds = datasets.load_from_disk(str(out))
    assert [int(n) for n in ds["seq_len"]] == [e.tokens for e in entries[:5]]
