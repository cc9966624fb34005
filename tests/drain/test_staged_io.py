"""Reading a staged dump: once, into the drain's own memory, one piece at a time where it streams."""

from __future__ import annotations

import pytest
import torch
from hsextract.drain.staged_io import PIECE, StagedReader
from hsextract.errors import StagingError
from hsextract.output.run_id import load_or_create_run_id
from support.staged_dumps import stage_sample


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


def test_streaming_a_staged_dump_holds_one_piece_of_its_rows_at_a_time(tmp_path):
    run = load_or_create_run_id(tmp_path / "out")
    staged = stage_sample(tmp_path / "dump", run, 0, tokens=8192, hidden_size=1024)  # 64 MiB of rows
    before = _rss_anon_kib()
    rows = []
    with StagedReader(tmp_path / "dump" / staged.rid) as reader:
        assert torch.equal(reader.input_ids, staged.input_ids)
        for first, piece in reader.pieces():
            assert len(piece) <= PIECE
            rows.append((first, bytes(piece[:16])))  # what each piece starts with
    grown_mib = (_rss_anon_kib() - before) / 1024
    assert grown_mib < 8, f"streaming a 64 MiB dump grew private memory by {grown_mib:.0f} MiB"
    flat = staged.hidden.reshape(8192, -1).view(torch.uint8)
    assert [first for first, _ in rows] == list(range(0, 8192, PIECE // flat.shape[1]))
    assert all(head == flat[first, :16].numpy().tobytes() for first, head in rows)


def test_a_staged_file_cut_short_is_refused_naming_it(tmp_path):
    run = load_or_create_run_id(tmp_path / "out")
    staged = stage_sample(tmp_path / "dump", run, 0, tokens=64)
    path = tmp_path / "dump" / staged.rid / "states.safetensors"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 8)
    with pytest.raises(StagingError, match=f"{path}: truncated"):
        StagedReader(path)
