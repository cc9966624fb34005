"""The ordered commit and the repair of an output directory, the drain's and collect's alike.

What each caller passes in is what a full volume does: the drain waits and the step is tried
again; collect stops short, gives the room of the files renamed last back, and keeps the rest.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from hsextract.output.commit import OrderedCommit, ToCommit, stop_short
from hsextract.output.manifest import ManifestAppender, ManifestEntry, entries_path, iter_entries
from hsextract.output.repair import clear_temporary, cut_torn_tail, remove_orphans, repair_torn_tail


def _path(i: int) -> str:
    return f"rows_{i // 2}/data_{i}.bin"


def _samples(tmp: Path, n: int) -> list[ToCommit]:
    tmp.mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(n):
        f = tmp / f"s{k}.tmp"
        f.write_bytes(b"x" * (k + 1))

        def row(i: int, rel: str, k: int = k) -> ManifestEntry:
            return ManifestEntry(i, 100 + k, f"hsx-0123abcd-{100 + k}", 1, rel, k + 1, "sha256:00")

        out.append(ToCommit(f, row))
    return out


def _full() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


def test_samples_are_renamed_in_index_order_and_recorded_after_the_ones_there(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    c = OrderedCommit(out, _path, 0, stop_short, tmp_dir=tmp_path / "tmp")
    assert c.commit(_samples(tmp_path / "tmp", 3)) == (list(iter_entries(out)), None)
    rows, full = c.commit(_samples(tmp_path / "tmp", 2))
    c.close()
    assert full is None and [e.output_index for e in rows] == [3, 4]
    assert [(e.output_index, e.file) for e in iter_entries(out)] == [(i, _path(i)) for i in range(5)]
    assert (out / _path(4)).read_bytes() == b"xx"
    assert c.commit([]) == ([], None)


def test_stop_short_gives_back_the_room_of_the_files_renamed_last(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    append = ManifestAppender.append

    def room_for_two(self, rows):
        rows = list(rows)
        if len(rows) > 2:
            raise _full()
        append(self, rows)

    monkeypatch.setattr(ManifestAppender, "append", room_for_two)
    c = OrderedCommit(out, _path, 0, stop_short)
    rows, full = c.commit(_samples(tmp_path / "tmp", 4))
    c.close()
    assert full is not None and full.errno == errno.ENOSPC
    assert [e.output_index for e in rows] == [0, 1] == [e.output_index for e in iter_entries(out)]
    assert c.count == 2
    assert not (out / _path(2)).exists() and not (out / _path(3)).exists()


def test_a_waiting_policy_tries_the_same_step_again(tmp_path, monkeypatch):
    import hsextract.output.commit as commit_mod

    out = tmp_path / "out"
    out.mkdir()
    failures = {"rename": 1, "append": 2}
    replace, append = commit_mod.os.replace, ManifestAppender.append

    def full_once(src, dst):
        if failures["rename"]:
            failures["rename"] -= 1
            raise _full()
        replace(src, dst)

    def full_twice(self, rows):
        if failures["append"]:
            failures["append"] -= 1
            raise _full()
        append(self, rows)

    monkeypatch.setattr(commit_mod.os, "replace", full_once)
    monkeypatch.setattr(ManifestAppender, "append", full_twice)
    waits: list[OSError] = []
    c = OrderedCommit(out, _path, 0, lambda exc: waits.append(exc) is None)
    rows, full = c.commit(_samples(tmp_path / "tmp", 3))
    c.close()
    assert full is None and len(waits) == 3
    assert [e.output_index for e in rows] == [e.output_index for e in iter_entries(out)] == [0, 1, 2]


def test_record_appends_rows_of_samples_placed_by_other_means(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    c = OrderedCommit(out, _path, 0, stop_short)
    c.record([ManifestEntry(0, 5, "hsx-0123abcd-5", 1, _path(0), 1, "sha256:00")])
    c.close()
    assert c.count == 1 and [e.dataset_index for e in iter_entries(out)] == [5]


def test_an_error_other_than_a_full_volume_is_raised(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()

    def broken(self, rows):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(ManifestAppender, "append", broken)
    c = OrderedCommit(out, _path, 0, lambda exc: pytest.fail("not a full volume"))
    with pytest.raises(OSError, match="I/O error"):
        c.commit(_samples(tmp_path / "tmp", 1))
    c.close()


def test_the_repair_cuts_a_torn_line_and_removes_orphans_and_temporary_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    c = OrderedCommit(out, _path, 0, stop_short)
    c.commit(_samples(tmp_path / "tmp", 4))
    c.close()
    data = entries_path(out).read_bytes()
    cut = data.rfind(b"\n", 0, len(data) - 1) + 1  # a kill mid-append of the last row
    entries_path(out).write_bytes(data[: cut + 10])
    assert repair_torn_tail(out) == 10 and repair_torn_tail(out) == 0
    assert cut_torn_tail(tmp_path / "missing.jsonl") == 0
    assert remove_orphans(out, _path, 3) == [_path(3)]
    assert not (out / _path(3)).exists() and (out / _path(2)).exists()
    tmp = tmp_path / "tmp"
    (tmp / "left.tmp").write_bytes(b"x")
    (tmp / "dir").mkdir()
    assert clear_temporary(tmp) == 2 and list(tmp.iterdir()) == []
    assert clear_temporary(tmp_path / "new") == 0 and (tmp_path / "new").is_dir()
