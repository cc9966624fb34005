"""Read a staged dump without copying it: map the states file, hand out tensor views.

`hsextract.staging.read_states` reads the whole file into a new bytes object; at drain rates
(GB/s of large samples) that copy and its page faults cost more than the disk write. Mapping
the tmpfs file gives the validator and the checksum the staged pages themselves, and the
writer can send the bytes to the output file with ``sendfile`` (kernel side, like ``cp``).
"""

from __future__ import annotations

import contextlib
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
    view: memoryview  # the same bytes (data_start .. data_start + data_len), mapped
    hidden_len: int = 0  # bytes of hidden rows at the start of the range

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def map_states(path: str | Path) -> MappedStates:
    """Map a staged states file; raise StagingError (naming the file) if it is truncated or malformed."""
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
        mm = _map_readonly_pages(fd, end) if end else None
    except BaseException:
        os.close(fd)
        raise
    view = memoryview(mm)[start:end] if mm is not None else memoryview(b"")
    shape = h["shape"]
    hidden = torch.frombuffer(view[:he], dtype=dtype).reshape(shape) if he else torch.empty(shape, dtype=dtype)
    input_ids = torch.frombuffer(view[he:ie], dtype=torch.int64) if ie > he else torch.empty(0, dtype=torch.int64)
    return MappedStates(StagedStates(hidden=hidden, input_ids=input_ids), fd, start, ie, view, he)


MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14; Python 3.11 lacks the name


def _map_readonly_pages(fd: int, length: int) -> mmap.mmap:
    """Map the tmpfs file's own pages: no copy, no memory beyond the page tables.

    The mapping is private and writable only because torch wants writable buffers; nothing writes
    to it, so no page is ever copied. MAP_POPULATE would be wrong here: on a private writable
    mapping it faults every page in for writing and so copies the whole file. MADV_POPULATE_READ
    maps the pages in one call instead of one fault per 4 KiB; where the kernel lacks it, the pages
    fault in as they are read.
    """
    mm = mmap.mmap(fd, length, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    with contextlib.suppress(OSError):
        mm.madvise(MADV_POPULATE_READ)
    return mm
