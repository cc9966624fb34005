"""The manifest: the client's resume point and the drain's record of what is durable."""

from __future__ import annotations

from hsextract.output.manifest import (
    ManifestAppender,
    ManifestEntry,
    completed_indices,
    entries_path,
    iter_entries,
)
from hsextract.output.repair import repair_torn_tail


def _entry(i: int, dataset_index: int) -> ManifestEntry:
    return ManifestEntry(
        output_index=i,
        dataset_index=dataset_index,
        rid=f"hsx-0123abcd-{dataset_index}",
        tokens=5,
        file=f"data_{i}.pt",
        bytes=10,
        checksum="sha256:00",
    )


def test_completed_indices_of_a_fresh_output_dir_is_empty(tmp_path):
    assert completed_indices(tmp_path) == set()


def test_completed_indices_lists_the_dataset_indices_appended(tmp_path):
    app = ManifestAppender(tmp_path)
    app.append([_entry(0, 7), _entry(1, 3)])
    app.append([_entry(2, 11)])
    app.close()
    assert completed_indices(tmp_path) == {3, 7, 11}


def test_a_torn_last_line_is_ignored_by_readers_and_cut_off_by_repair(tmp_path):
    app = ManifestAppender(tmp_path)
    app.append([_entry(0, 7)])
    app.close()
    with open(entries_path(tmp_path), "ab") as f:
        f.write(_entry(1, 8).to_line()[:20])
    assert completed_indices(tmp_path) == {7}
    assert repair_torn_tail(tmp_path) == 20
    assert [e.dataset_index for e in iter_entries(tmp_path)] == [7]
    assert repair_torn_tail(tmp_path) == 0
