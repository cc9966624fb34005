"""Read a staged dump once, into memory the drain owns: the bytes it checks are the bytes it writes.

The drain proves each sample against the fingerprint the forward pass computed, then writes it and
records its checksum. Both must be taken from the same bytes: a drain that fingerprinted the staged
file's pages and later copied the file again (a mapping, then ``sendfile``) wrote whatever the file
held by then, under a fresh checksum. So `StagedReader` reads the token ids, then the rows piece by
piece (whole rows per piece, `PIECE` bytes or one row), each byte once, with ``preadv`` into
buffers of the drain's own: a piece buffer it reuses, or the caller's memory where a format needs
the sample whole. Everything downstream (the checks, the format's encoding, the hash, the write)
reads those buffers and never the staged file again.

A piece is small enough to stay in the CPU cache while it is checked, hashed and written (measured
on 2 cores: 4 MiB pieces drained a third slower than 1 MiB ones), so the private read costs one
copy out of the staging filesystem and nothing more.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hsextract.errors import StagingError
from hsextract.staging.dumps import DTYPES, FP8_CODE, SCALES_TENSOR, STATES_FILE, parse_header

# The staged dtypes of `hidden`, and FP8 rows (a capture that quantizes: then `hidden_scales` follows the ids).
_ST_TO_TORCH = {code: dt for _, (dt, code, _) in DTYPES.items()} | {FP8_CODE: torch.float8_e4m3fn}
_MAX_HEADER = 100_000_000
PIECE = 1 << 20  # bytes of rows read, checked, hashed and written at a time (at least one row)
_IOV_MAX = 1024  # buffers per preadv (Linux's UIO_MAXIOV; POSIX guarantees at least 16)


@dataclass(frozen=True)
class RowsLayout:
    """The shape of a staged dump's rows, from its header: ``[rows, slots, hidden]`` of `dtype`."""

    rows: int
    slots: int
    hidden: int
    dtype: torch.dtype

    @property
    def fp8(self) -> bool:
        """The capture quantized the rows (float8_e4m3fn, their scales beside them)."""
        return self.dtype == torch.float8_e4m3fn

    @property
    def row_bytes(self) -> int:
        return self.slots * self.hidden * torch.empty((), dtype=self.dtype).element_size()

    @property
    def rows_bytes(self) -> int:
        return self.rows * self.row_bytes

    def shape(self) -> tuple[int, int, int]:
        return self.rows, self.slots, self.hidden


class StagedReader:
    """One staged states file, open for one private read: its header checked and its token ids read
    at construction (StagingError naming the file if it is truncated or malformed), its rows read by
    `pieces`. Use it as a context manager, or `close` it."""

    def __init__(self, path: str | Path):
        p = Path(path)
        if p.is_dir():
            p = p / STATES_FILE
        self.path = p
        try:
            self._fd = os.open(p, os.O_RDONLY)
        except OSError as exc:
            raise StagingError(f"{p}: cannot read ({exc})") from exc
        try:
            self.layout, self._data_start = self._read_header()
            ids = bytearray(8 * self.layout.rows)
            self._read_exact(memoryview(ids), self._data_start + self.layout.rows_bytes)
        except BaseException:
            self.close()
            raise
        self.ids_bytes = memoryview(ids)
        self.input_ids = torch.frombuffer(ids, dtype=torch.int64) if ids else torch.empty(0, dtype=torch.int64)
        # float32 [rows, 1, 1]: an FP8-staged file's scales, read whole at once (4 bytes a token); else None.
        self.scales: torch.Tensor | None = None
        if self.layout.fp8:
            raw = bytearray(4 * self.layout.rows)
            try:
                self._read_exact(memoryview(raw), self._data_start + self.data_len)
            except BaseException:
                self.close()
                raise
            scales = torch.frombuffer(raw, dtype=torch.float32) if raw else torch.empty(0, dtype=torch.float32)
            self.scales = scales.reshape(self.layout.rows, 1, 1)

    @property
    def data_len(self) -> int:
        """Bytes of the rows followed by the token ids: the staged data, as the speculators format stores it."""
        return self.layout.rows_bytes + len(self.ids_bytes)

    def _read_header(self) -> tuple[RowsLayout, int]:
        p, fd = self.path, self._fd
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        if len(head) == 8:
            head += os.pread(fd, min(int.from_bytes(head, "little"), _MAX_HEADER), 8)
        header, start = parse_header(head, p)
        try:
            h, ids = header["hidden"], header["input_ids"]
            dtype = _ST_TO_TORCH[h["dtype"]]
            hs, he = h["data_offsets"]
            is_, ie = ids["data_offsets"]
            rows, slots, hidden = (int(d) for d in h["shape"])
        except KeyError as exc:
            raise StagingError(f"{p}: header lacks {exc.args[0]!r}") from exc
        except (TypeError, ValueError) as exc:
            raise StagingError(
                f"{p}: hidden shape {header['hidden'].get('shape')!r} is not [tokens, slots, hidden]"
            ) from exc
        if (hs, is_) != (0, he) or ids["dtype"] != "I64":
            raise StagingError(f"{p}: unexpected layout (hidden {h['data_offsets']}, input_ids {ids['data_offsets']})")
        layout = RowsLayout(rows, slots, hidden, dtype)
        if layout.rows_bytes != he or (ie - he) != 8 * int(ids["shape"][0]) or int(ids["shape"][0]) != rows:
            raise StagingError(f"{p}: header shapes {h['shape']} / {ids['shape']} do not match their byte ranges")
        end = ie
        if layout.fp8:  # its scales, float32 [rows, 1, 1], right after the ids
            sc = header.get(SCALES_TENSOR)
            want = {"dtype": "F32", "shape": [rows, 1, 1], "data_offsets": [ie, ie + 4 * rows]}
            if sc != want:
                raise StagingError(f"{p}: FP8 rows with {SCALES_TENSOR} {sc!r}, expected {want!r}")
            end = ie + 4 * rows
        elif SCALES_TENSOR in header:
            raise StagingError(f"{p}: {h['dtype']} rows with {SCALES_TENSOR}: only FP8 rows have scales")
        if size < start + end:
            raise StagingError(f"{p}: truncated: {size} bytes, header promises {start + end}")
        return layout, start

    def _read_exact(self, into: memoryview, offset: int) -> None:
        done = 0
        while done < len(into):
            n = os.preadv(self._fd, [into[done:]], offset + done)
            if n == 0:
                raise StagingError(
                    f"{self.path}: ended at byte {offset + done} while read, header promises "
                    f"{offset + len(into)} (the file shrank)"
                )
            done += n

    def pieces(self, into: memoryview | None = None) -> Iterator[tuple[int, memoryview]]:
        """(first row, its rows' bytes) for every piece of rows in order, each read once. Read into
        `into` (the caller's memory for all the rows, ``layout.rows_bytes``) at the rows' own offsets,
        or else into one piece buffer reused for each piece: a piece is then valid only until the next."""
        row_bytes, rows = self.layout.row_bytes, self.layout.rows
        per_piece = max(1, PIECE // max(1, row_bytes))
        if into is not None and len(into) != self.layout.rows_bytes:
            raise ValueError(f"{len(into)} bytes given for {self.layout.rows_bytes} bytes of rows of {self.path}")
        own = memoryview(bytearray(min(rows, per_piece) * row_bytes)) if into is None else None
        for first in range(0, rows, per_piece):
            n = (min(rows, first + per_piece) - first) * row_bytes
            target = into[first * row_bytes : first * row_bytes + n] if into is not None else own[:n]  # type: ignore[index]
            self._read_exact(target, self._data_start + first * row_bytes)
            yield first, target

    def scatter(self, parts: Sequence[np.ndarray]) -> Iterator[tuple[int, list[np.ndarray]]]:
        """Every row read straight into `parts`, piece by piece: each part a C-contiguous uint8
        ``[rows, width]`` array, the widths adding up to a row, each row's bytes spread over the parts
        in order (a format's slot groups). Yields (first row, each part's rows just read) per piece.

        The kernel spreads the rows as it copies them (``preadv`` with one buffer per row and part),
        so a format that stores groups of slots apart costs no second copy of the rows."""
        row_bytes, rows = self.layout.row_bytes, self.layout.rows
        if sum(p.shape[1] for p in parts) != row_bytes or any(p.shape[0] != rows for p in parts):
            raise ValueError(f"parts {[p.shape for p in parts]} do not tile {rows} rows of {row_bytes} bytes")
        per_piece = max(1, min(PIECE // max(1, row_bytes), _IOV_MAX // max(1, len(parts))))
        flat = [(p.reshape(-1).data, p.shape[1]) for p in parts if p.shape[1]]  # slices of these are cheap
        for first in range(0, rows, per_piece):
            last = min(rows, first + per_piece)
            views = [view[r * w : (r + 1) * w] for r in range(first, last) for view, w in flat]
            self._read_vectors(views, self._data_start + first * row_bytes, (last - first) * row_bytes)
            yield first, [p[first:last] for p in parts]

    def _read_vectors(self, views: list[memoryview], offset: int, total: int) -> None:
        """Fill `views` (`total` bytes) in order from `offset`, looping over short reads."""
        done = os.preadv(self._fd, views, offset)
        while done < total:  # rare: a short read; go on from where it stopped
            skip, rest = done, []
            for v in views:
                if skip >= len(v):
                    skip -= len(v)
                else:
                    rest.append(v[skip:])
                    skip = 0
            views = rest
            n = os.preadv(self._fd, views, offset + done)
            if n == 0:
                raise StagingError(
                    f"{self.path}: ended at byte {offset + done} while read, header promises "
                    f"{offset + total} (the file shrank)"
                )
            done += n

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> StagedReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
