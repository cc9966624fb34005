"""A batch's segments become writer tasks: whole requests in groups, long ones in slices that cover
every row once, the ids with the first slice only."""

from __future__ import annotations

from hsextract.capture.core import RequestState, Segment
from hsextract.capture.slices import SliceTask, group_whole, rows_per_slice, split_whole
from hsextract.staging.dumps import StateFileLayout


def segment(prompt_len: int, rows: int, dst_row: int = 0, create: bool = True) -> Segment:
    state = RequestState(f"hsx-ab12cd34-{prompt_len}-{dst_row}", StateFileLayout(prompt_len, 4, 16))
    return Segment(state, batch_row=0, dst_row=dst_row, rows=rows, create=create)


def test_only_every_row_of_a_new_request_within_one_slice_is_whole():
    whole = segment(8, 8)
    chunk = segment(16, 8)  # the first chunk of a longer prompt
    later = segment(16, 8, dst_row=8, create=False)
    long = segment(40, 40)  # more rows than one slice
    assert split_whole([chunk, whole, later, long], per_slice_rows=32) == ([whole], [chunk, later, long])


def test_a_long_segment_is_sliced_to_cover_each_row_once_with_its_ids_in_the_first_slice():
    seg = segment(100, 100)
    tasks = SliceTask.slices_of(seg, rows_per_slice(32 * 128, 128), mapped=None)
    assert [(t.start, t.end) for t in tasks] == [(0, 32), (32, 64), (64, 96), (96, 100)]
    assert [t.with_ids for t in tasks] == [True, False, False, False]
    assert not any(t.whole for t in tasks)
    assert SliceTask.of_whole(segment(8, 8)).whole


def test_whole_requests_go_to_few_tasks_each_of_at_least_four_requests():
    whole = [segment(8, 8) for _ in range(10)]
    assert group_whole(whole, row_bytes=128, num_threads=8) == [whole]  # far below 8 MiB: one task
    big = [segment(8, 8) for _ in range(40)]
    groups = group_whole(big, row_bytes=1 << 20, num_threads=8)  # 320 MiB in all
    assert len(groups) == 8 and sorted(id(s) for g in groups for s in g) == sorted(map(id, big))
    assert group_whole([], row_bytes=128, num_threads=8) == []
