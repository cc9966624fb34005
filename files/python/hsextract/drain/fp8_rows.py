"""The drain's side of an FP8 set (``--precision fp8``) staged in bf16: the staged rows, once checked,
quantized a piece at a time (hsextract.fp8), and what the drain checks of what it writes. (A capture
that quantizes on its device stages the FP8 rows themselves: hsextract.drain.fp8_staged checks those,
and the drain writes them as staged.)

The staged rows are checked as for any set (the capture's fingerprint, finite values: hsextract.drain.
validate) from the very bytes read; each piece of whole rows is then quantized on its own (a token's
scale depends on its own row only, so pieces give the bytes the whole would), and what is written is
checked before the file is made durable: the FP8 rows ``[T, K + 1, H]`` hold no NaN, the scales
``[T, 1, 1]`` are finite and above 0 (`fp8.scales_problem`). A failure is the dump's quarantine
(``non_finite``), never a file the trainer would read.

The manifest's fingerprint of an FP8 sample is of what the file stores: each token's FP8 row followed
by its float32 scale, by the fingerprint's own definition (`hsextract.fp8.stored_row_values_np`), taken
from the bytes written. ``finalize --verify``, collect and pull recompute it from the file
(hsextract.formats.sample_check); the capture's fingerprint, of the bf16 rows, was checked before. A
capture that quantizes takes this same fingerprint of the rows it stages, so its sets are the same.
"""

from __future__ import annotations

import torch

from hsextract import fingerprint, fp8
from hsextract.drain.validate import NON_FINITE, InvalidDump

# Rows quantized at once where a sample is held whole: the float32 temporaries of a piece stay in the
# CPU cache (measured on 2 cores: 1 MiB pieces quantize at about 1 GB/s of bf16 per core, a whole
# 128 MiB sample at 0.1 GB/s, paying page faults for its temporaries).
PIECE_BYTES = 1 << 20


class FP8Rows:
    """A sample's rows quantized piece by piece, in order: `piece` takes the bytes of whole staged rows
    and returns their FP8 bytes; `finish`, after the last, checks the scales and gives them with the
    fingerprint of the stored rows. The rows handed in must already be checked (or be checked before
    `finish` is called: a NaN the checks will report is not this class's to report first)."""

    def __init__(self, rows: int, slots: int, hidden: int, dtype: torch.dtype, input_ids: torch.Tensor):
        self.shape = (rows, slots, hidden)
        self._dtype = dtype
        self._ids = input_ids.numpy()
        self._scales = torch.empty((rows, 1, 1), dtype=torch.float32)
        self._done = 0
        self._sum = 0
        self._nan_row: int | None = None

    @property
    def fp8_bytes(self) -> int:
        rows, slots, hidden = self.shape
        return rows * slots * hidden

    def piece(self, first: int, data: memoryview | torch.Tensor) -> memoryview:
        """Rows ``first ..`` (bytes of whole staged rows, or a tensor of them) as FP8 bytes."""
        _, slots, hidden = self.shape
        if first != self._done:
            raise ValueError(f"rows {first}.. given after {self._done}: the pieces must come in order")
        rows = data if isinstance(data, torch.Tensor) else torch.frombuffer(data, dtype=self._dtype)
        rows = rows.reshape(-1, slots, hidden)
        n = rows.shape[0]
        q, scales = fp8.quantize(rows)
        self._scales[first : first + n] = scales
        raw = q.reshape(n, slots * hidden).view(torch.uint8).numpy()
        if self._nan_row is None and (row := fp8.first_nan_row(raw)) is not None:
            self._nan_row = first + row
        values = fp8.stored_row_values_np(raw, scales.numpy(), self._ids[first : first + n])
        self._sum = fingerprint.add(self._sum, fingerprint.combine(values, first))
        self._done += n
        return raw.reshape(-1).data

    def finish(self) -> tuple[torch.Tensor, str]:
        """(scales float32 [T, 1, 1], the stored rows' fingerprint), once every row went by and what
        is written is an FP8 sample a trainer can read (InvalidDump ``non_finite`` otherwise)."""
        if self._done != self.shape[0]:
            raise ValueError(f"{self._done} of {self.shape[0]} rows quantized")
        problem = fp8.unreadable(self._scales, self.shape[0], self._nan_row)
        if problem is not None:
            raise InvalidDump(NON_FINITE, f"the rows quantized to FP8 are not readable: {problem}")
        return self._scales, fingerprint.to_text(self._sum)

    def scale_bytes(self):  # -> Iterator[memoryview]
        """The scales' bytes, for the file's last tensor: read when the writer reaches them, after `finish`."""
        yield memoryview(self._scales.reshape(-1).view(torch.uint8).numpy())


def quantize_whole(hidden: torch.Tensor, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(FP8 rows [T, K + 1, H], scales [T, 1, 1], the stored fingerprint) of checked rows held whole,
    quantized a piece of `PIECE_BYTES` at a time into one tensor."""
    rows, slots, width = hidden.shape
    q = FP8Rows(rows, slots, width, hidden.dtype, input_ids)
    out = torch.empty((rows, slots, width), dtype=fp8.DTYPE)
    flat = out.view(torch.uint8).reshape(-1)
    step = max(1, PIECE_BYTES // max(1, slots * width * hidden.element_size()))
    for a in range(0, rows, step):
        b = min(rows, a + step)
        flat[a * slots * width : b * slots * width] = torch.frombuffer(q.piece(a, hidden[a:b]), dtype=torch.uint8)
    scales, stored = q.finish()
    return out, scales, stored
