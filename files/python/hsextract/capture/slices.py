"""A landed batch's segments cut into writer tasks, and what each task reads from the host buffer.

Two kinds of task, decided once per segment when the batch is dispatched (`split_whole`):

* the whole requests of a batch (short prompts: most of them), in a few groups (`group_whole`):
  each request's file created and written in one call;
* a long or chunked request in slices of ``slice_bytes`` (`SliceTask`), written by several
  writer threads at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hsextract import fingerprint, fp8
from hsextract.capture.core import Segment
from hsextract.capture.file_io import MappedFile
from hsextract.capture.host_stage import StagedBatch

_MiB = 1 << 20


def rows_per_slice(slice_bytes: int, row_bytes: int) -> int:
    return max(1, max(int(slice_bytes), 1) // row_bytes)


def split_whole(segments: list[Segment], per_slice_rows: int) -> tuple[list[Segment], list[Segment]]:
    """(whole requests, the other segments), each in batch order. A whole request is every row of
    a new request in a segment no longer than one slice."""
    whole: list[Segment] = []
    parts: list[Segment] = []
    for seg in segments:
        is_whole = seg.create and seg.dst_row == 0 and seg.rows == seg.state.prompt_len and seg.rows <= per_slice_rows
        (whole if is_whole else parts).append(seg)
    return whole, parts


def group_whole(whole: list[Segment], row_bytes: int, num_threads: int) -> list[list[Segment]]:
    """Whole requests split into a few groups, one writer task each.

    Each task costs the server's process a hand-over between threads under the GIL, which
    competes with SGLang's scheduler thread: 256 short prompts in flight are hundreds of
    requests a second. So a batch's whole requests go to as few tasks as keep the writers
    busy: at most one per writer thread, with at least 4 requests and 8 MiB each.
    """
    if not whole:
        return []
    nbytes = sum(seg.rows for seg in whole) * row_bytes
    n = max(1, min(max(1, num_threads), len(whole) // 4, nbytes // (8 * _MiB)))
    return [whole[i::n] for i in range(n)]


@dataclass(frozen=True)
class SliceTask:
    """Rows ``[start, end)`` of a segment, for one writer thread."""

    seg: Segment
    start: int
    end: int
    with_ids: bool  # the segment's first slice writes its token ids too
    whole: bool = False  # the whole request (`split_whole`): its file is created and written in one call
    mapped: MappedFile | None = None  # written through this shared mapping, else with pwrite

    @classmethod
    def of_whole(cls, seg: Segment) -> SliceTask:
        return cls(seg, 0, seg.rows, with_ids=True, whole=True)

    @classmethod
    def slices_of(cls, seg: Segment, per_slice_rows: int, mapped: MappedFile | None) -> list[SliceTask]:
        """A long (or chunked) request's segment in slices of at most ``per_slice_rows`` rows."""
        return [
            cls(seg, a, min(a + per_slice_rows, seg.rows), with_ids=a == 0, mapped=mapped)
            for a in range(0, seg.rows, per_slice_rows)
        ]

    @property
    def first_batch_row(self) -> int:
        return self.seg.batch_row + self.start

    @property
    def dst_row(self) -> int:
        """The slice's first row in the request's file."""
        return self.seg.dst_row + self.start

    def rows_in(self, job: StagedBatch, mv: memoryview) -> memoryview:
        """The slice's rows in the batch's host buffer ``mv``."""
        src = self.first_batch_row * job.row_bytes
        return mv[src : src + (self.end - self.start) * job.row_bytes]

    def ids_in(self, job: StagedBatch, mv: memoryview) -> memoryview:
        """The whole segment's token ids in the batch's host buffer ``mv``."""
        start = job.ids_offset(self.seg.batch_row)
        return mv[start : start + 8 * self.seg.rows]

    def scales_in(self, job: StagedBatch, mv: memoryview) -> memoryview:
        """The whole segment's FP8 scales in the batch's host buffer ``mv`` (empty without them)."""
        start = job.scales_offset + job.scale_bytes * self.seg.batch_row
        return mv[start : start + job.scale_bytes * self.seg.rows]

    def mismatch(self, job: StagedBatch, mv: memoryview) -> str:
        """ "" if the slice's rows in the host buffer (FP8 rows: with their scales) have the values the
        forward pass computed on the device; else what differs."""
        first, stop = self.first_batch_row, self.seg.batch_row + self.end
        ids = job.ids.numpy()[first:stop]
        if job.scale_bytes:
            raw = np.frombuffer(self.rows_in(job, mv), dtype=np.uint8).reshape(stop - first, job.row_bytes)
            got = fp8.stored_row_values_np(raw, job.scales.numpy()[first:stop], ids)
        else:
            got = fingerprint.row_values_np(self.rows_in(job, mv), ids, job.row_bytes)
        bad = np.flatnonzero(got != job.row_values.numpy()[first:stop])
        if not len(bad):
            return ""
        a, b = self.dst_row, self.seg.dst_row + self.end
        return (
            f"{len(bad)} of rows {a}..{b - 1} of the host copy differ from what the forward pass computed "
            f"(first: prompt row {a + int(bad[0])}); the copy to the host read memory that had changed"
        )
