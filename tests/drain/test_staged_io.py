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


@pytest.mark.parametrize("groups", [[(0, 3), (3, 4)], [(0, 1), (1, 2), (2, 3), (3, 4)]])
def test_rows_scattered_into_slot_groups_are_the_rows_and_check_as_the_whole_rows(tmp_path, groups):
    import numpy as np
    from hsextract.drain.validate import RowChecks
    from hsextract.staging.dumps import read_done_marker

    run = load_or_create_run_id(tmp_path / "out")
    staged = stage_sample(tmp_path / "dump", run, 0, tokens=700, hidden_size=256)  # several pieces
    d = tmp_path / "dump" / staged.rid
    marker = read_done_marker(d)
    with StagedReader(d) as reader:
        slot = reader.layout.row_bytes // reader.layout.slots
        parts = [np.empty((700, (b - a) * slot), dtype=np.uint8) for a, b in groups]
        checks = RowChecks(marker, reader.layout, reader.input_ids)
        firsts = []
        for first, blocks in reader.scatter(parts):
            firsts.append(first)
            checks.parts(first, blocks)
        assert checks.finish() == marker.fingerprint
    assert len(firsts) > 1
    flat = staged.hidden.reshape(700, -1).view(torch.uint8).numpy()
    for (a, b), part in zip(groups, parts, strict=True):
        assert np.array_equal(part, flat[:, a * slot : b * slot])


def test_a_nan_in_a_scattered_slot_group_is_found_at_its_token(tmp_path):
    import numpy as np
    from hsextract.drain.validate import InvalidDump, RowChecks
    from hsextract.staging.dumps import read_done_marker

    run = load_or_create_run_id(tmp_path / "out")
    staged = stage_sample(tmp_path / "dump", run, 0, tokens=300, hidden_size=256)
    d = tmp_path / "dump" / staged.rid
    marker = read_done_marker(d)
    with StagedReader(d) as reader:
        row_bytes, slot = reader.layout.row_bytes, reader.layout.row_bytes // reader.layout.slots
        start = reader._data_start
    with open(d / "states.safetensors", "r+b") as f:  # token 211's final slot (the second group) becomes NaN
        f.seek(start + 211 * row_bytes + 3 * slot)
        f.write(torch.full((slot // 2,), float("nan"), dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes())
    with StagedReader(d) as reader:
        parts = [np.empty((300, 3 * slot), dtype=np.uint8), np.empty((300, slot), dtype=np.uint8)]
        checks = RowChecks(marker, reader.layout, reader.input_ids)
        for first, blocks in reader.scatter(parts):
            checks.parts(first, blocks)
        with pytest.raises(InvalidDump) as caught:
            checks.finish()
    assert caught.value.reason == "fingerprint_mismatch"  # the rows changed: the fingerprint decides first
    assert checks._non_finite is not None and "token 211" in checks._non_finite.detail
