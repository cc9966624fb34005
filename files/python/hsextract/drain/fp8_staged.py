"""The checks of a dump the capture staged in FP8 (its ``precision: fp8``): the drain writes such rows as
staged, so it checks them as it checks what it quantizes itself (hsextract.drain.fp8_rows).

The capture quantized the rows on its device (hsextract.fp8) and took each stored row's fingerprint
value of its FP8 bytes followed by its float32 scale (`hsextract.fp8.stored_row_values`), the very
definition the drain records for an FP8 sample. So the fingerprint recomputed here from the staged
bytes proves the rows and scales are those the forward pass made, and it is the manifest's
fingerprint as it stands: a set of FP8-staged dumps is the set the drain would have quantized. Then
what a trainer would read is checked as for a drain-quantized set: no NaN code in the FP8 rows, the
scales ``[T, 1, 1]`` finite and above 0 (`hsextract.fp8.scales_problem`).
"""

from __future__ import annotations

import numpy as np
import torch

from hsextract import fingerprint, fp8
from hsextract.drain.staged_io import RowsLayout
from hsextract.drain.validate import NON_FINITE, InvalidDump, matching_fingerprint
from hsextract.staging.dumps import DoneMarker


class StagedFP8Checks:
    """`hsextract.drain.validate.RowChecks` for FP8-staged rows, fed each piece as the drain reads it:
    the piece's share of the fingerprint (with the scales read at the start), and its NaN codes.
    `finish`, after the last piece, raises InvalidDump for a fingerprint the forward pass did not
    compute (``fingerprint_mismatch``: it decides first, as for bf16 rows) or else for rows or scales a
    trainer cannot read (``non_finite``), and returns the fingerprint."""

    def __init__(self, marker: DoneMarker, layout: RowsLayout, input_ids: torch.Tensor, scales: torch.Tensor):
        if not layout.fp8:
            raise ValueError(f"rows of {layout.dtype} are not FP8-staged rows")
        self._want = marker.fingerprint
        self._layout = layout
        self._scales = scales
        self._flat_scales = scales.reshape(-1).numpy()
        self._ids = input_ids.numpy()
        self._sum = 0
        self._rows = 0
        self._nan_row: int | None = None
        self.fingerprint = ""  # once `finish` passed

    def piece(self, first_row: int, piece: memoryview) -> None:
        """Rows ``first_row ..`` (whole rows, in order)."""
        row_bytes = max(1, self._layout.row_bytes)
        n = len(piece) // row_bytes
        if first_row != self._rows:
            raise ValueError(f"rows {first_row}.. given after {self._rows} rows: the pieces must come in order")
        raw = np.frombuffer(piece, dtype=np.uint8, count=n * row_bytes).reshape(n, row_bytes)
        if self._nan_row is None and (row := fp8.first_nan_row(raw)) is not None:
            self._nan_row = first_row + row
        stop = first_row + n
        values = fp8.stored_row_values_np(raw, self._flat_scales[first_row:stop], self._ids[first_row:stop])
        self._sum = fingerprint.add(self._sum, fingerprint.combine(values, first_row))
        self._rows = stop

    def finish(self) -> str:
        """The fingerprint, once every row was checked (InvalidDump as the class says)."""
        if self._rows != self._layout.rows:
            raise ValueError(f"{self._rows} of {self._layout.rows} rows checked")
        got = matching_fingerprint(self._sum, self._want, "the staged FP8 rows and scales")
        problem = fp8.unreadable(self._scales, self._layout.rows, self._nan_row)
        if problem is not None:
            raise InvalidDump(NON_FINITE, f"the FP8 rows the capture staged are not readable: {problem}")
        self.fingerprint = got
        return got
