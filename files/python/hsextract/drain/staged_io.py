"""Read a staged dump without copying it: map the states file, hand out tensor views.

`hsextract.staging.read_states` reads the whole file into a new bytes object; at drain rates
(GB/s of large samples) that copy and its page faults cost more than the disk write. Mapping
the tmpfs file gives the validator and the checksum the staged pages themselves, and the
writer can send the bytes to the output file with ``sendfile`` (kernel side, like ``cp``).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from hsextract.errors import StagingError
from hsextract.staging import DTYPES, STATES_FILE, StagedStates, parse_header

_ST_TO_TORCH = {code: dt for _, (dt, code, _) in DTYPES.items()}
_MAX_HEADER = 100_000_000


@dataclass
class MappedStates:
    """A mapped ``states.safetensors``: tensors viewing the file, and where their bytes lie in it."""

    states: StagedStates
    fd: int  # open on the staged file, for sendfile; close() it when the sample is written
    data_start: int  # file offset of the first hidden byte
    data_len: int  # bytes of hidden rows followed by the input ids (contiguous)
    view: memoryview | None  # the same bytes (data_start .. data_start + data_len), mapped (None: not mapped)
    hidden_len: int = 0  # bytes of hidden rows at the start of the range

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def map_states(path: str | Path, *, map_hidden: bool = True) -> MappedStates:
    """Map a staged states file; raise StagingError (naming the file) if it is truncated or malformed.

    With ``map_hidden=False`` nothing of the rows is touched: ``hidden`` is a meta tensor (shape
    and dtype only) and ``view`` is None; the writer then streams and checks the rows itself.
    """
    p = Path(path)
    if p.is_dir():
        p = p / STATES_FILE
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError as exc:
        raise StagingError(f"{p}: cannot read ({exc})") from exc
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        if len(head) == 8:
            n = int.from_bytes(head, "little")
            head += os.pread(fd, min(n, _MAX_HEADER), 8)
        header, start = parse_header(head, p)
        try:
            h, ids = header["hidden"], header["input_ids"]
            dtype = _ST_TO_TORCH[h["dtype"]]
            hs, he = h["data_offsets"]
            is_, ie = ids["data_offsets"]
        except KeyError as exc:
            raise StagingError(f"{p}: header lacks {exc.args[0]!r}") from exc
        if (hs, is_) != (0, he) or ids["dtype"] != "I64":
            raise StagingError(f"{p}: unexpected layout (hidden {h['data_offsets']}, input_ids {ids['data_offsets']})")
        elem = torch.empty((), dtype=dtype).element_size()
        rows = 1
        for dim in h["shape"]:
            rows *= int(dim)
        if rows * elem != he or (ie - he) != 8 * int(ids["shape"][0]):
            raise StagingError(f"{p}: header shapes {h['shape']} / {ids['shape']} do not match their byte ranges")
        end = start + ie
        if size < end:
            raise StagingError(f"{p}: truncated: {size} bytes, header promises {end}")
        if not map_hidden:
            shape = h["shape"]
            hidden = torch.empty(shape, dtype=dtype, device="meta")
            raw_ids = os.pread(fd, ie - he, start + he)
            if len(raw_ids) != ie - he:
                raise StagingError(f"{p}: truncated while reading the token ids")
            ids_buf = bytearray(raw_ids)
            input_ids = torch.frombuffer(ids_buf, dtype=torch.int64) if ids_buf else torch.empty(0, dtype=torch.int64)
            return MappedStates(StagedStates(hidden=hidden, input_ids=input_ids), fd, start, ie, None, he)
        # A private, writable mapping (torch wants writable buffers) that never copies unless
        # written to, which nothing does.
        # MAP_POPULATE faults the pages in with one call instead of one fault per 4 KiB.
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
        mm = mmap.mmap(fd, end, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE) if end else None
    except BaseException:
        os.close(fd)
        raise
    view = memoryview(mm)[start:end] if mm is not None else memoryview(b"")
    shape = h["shape"]
    hidden = torch.frombuffer(view[:he], dtype=dtype).reshape(shape) if he else torch.empty(shape, dtype=dtype)
    input_ids = torch.frombuffer(view[he:ie], dtype=torch.int64) if ie > he else torch.empty(0, dtype=torch.int64)
    return MappedStates(StagedStates(hidden=hidden, input_ids=input_ids), fd, start, ie, view, he)
