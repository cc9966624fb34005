"""The staging layout in /dev/shm: the contract between the capture (writer) and the drain (reader).

::

    <dump_dir>/
      <rid>/states.safetensors   rows of one request; written by the capture, chunk by chunk
      <rid>/done.json            written last, atomically (write a temporary name, then rename)
      _records/<rid>.json        the client's record of the sample (see hsextract.records)

``states.safetensors`` is a standard safetensors file (no pickle) holding

* ``hidden``    ``[P, K + 1, H]`` in the model dtype: the K aux layers in capture order, then the
  final hidden state (post- or pre-norm, as ``done.json`` says), one row per prompt token;
* ``input_ids`` ``int64 [P]``: the token ids the server actually ran.

``P`` is the prompt length. The file is created at its full size when the first chunk of a
request arrives and each (chunked-prefill) chunk is written at its row offset, so a request of
any number of chunks is one file and the drain reads one contiguous block per sample. The rows
``[n, K + 1, H]`` are exactly the ``hidden_states`` layout of the speculators format.

``done.json`` exists only once every row of the prompt has been written; a directory without it
is in progress (or abandoned) and is never read as a sample.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from hsextract.errors import StagingError

STATES_FILE = "states.safetensors"
DONE_FILE = "done.json"
RECORDS_DIR = "_records"
FORMAT_VERSION = 1
# Data starts on a 4 KiB boundary so row slices stay page aligned in the file.
_ALIGN = 4096

DTYPES: dict[str, tuple[torch.dtype, str, int]] = {
    "bfloat16": (torch.bfloat16, "BF16", 2),
    "float16": (torch.float16, "F16", 2),
    "float32": (torch.float32, "F32", 4),
}
_ST_TO_NAME = {st: name for name, (_, st, _) in DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """The staging name of a torch dtype ("bfloat16", ...); raise for dtypes the format does not hold."""
    for name, (dt, _, _) in DTYPES.items():
        if dt == dtype:
            return name
    raise StagingError(f"dtype {dtype} cannot be staged; supported: {', '.join(DTYPES)}")


@dataclass(frozen=True)
class StateFileLayout:
    """Byte layout of one request's ``states.safetensors`` (shared by writer and reader)."""

    prompt_len: int
    num_slots: int  # K aux layers + 1 final hidden state
    hidden_size: int
    dtype: str = "bfloat16"

    @property
    def elem_size(self) -> int:
        return DTYPES[self.dtype][2]

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's hidden rows ([K + 1, H])."""
        return self.num_slots * self.hidden_size * self.elem_size

    @property
    def header(self) -> bytes:
        """The 8-byte length prefix plus the JSON header, padded so data starts aligned."""
        hidden_len = self.prompt_len * self.row_bytes
        meta = {
            "hidden": {
                "dtype": DTYPES[self.dtype][1],
                "shape": [self.prompt_len, self.num_slots, self.hidden_size],
                "data_offsets": [0, hidden_len],
            },
            "input_ids": {
                "dtype": "I64",
                "shape": [self.prompt_len],
                "data_offsets": [hidden_len, hidden_len + 8 * self.prompt_len],
            },
            "__metadata__": {"hsextract_staging": str(FORMAT_VERSION)},
        }
        body = json.dumps(meta, separators=(",", ":")).encode()
        total = 8 + len(body)
        pad = (-total) % _ALIGN
        body += b" " * pad
        return struct.pack("<Q", len(body)) + body

    @property
    def data_start(self) -> int:
        return len(self.header)

    def hidden_offset(self, row: int) -> int:
        """File offset of row ``row`` of ``hidden``."""
        return self.data_start + row * self.row_bytes

    def ids_offset(self, row: int) -> int:
        """File offset of element ``row`` of ``input_ids``."""
        return self.data_start + self.prompt_len * self.row_bytes + 8 * row

    @property
    def file_size(self) -> int:
        return self.ids_offset(self.prompt_len)


@dataclass
class DoneMarker:
    """What ``done.json`` records about a complete dump."""

    rid: str
    prompt_len: int
    num_aux: int
    hidden_size: int
    dtype: str
    eagle_aux_hidden_state_layer_ids: list[int]
    sglang_layers_to_capture: list[int]
    num_hidden_layers: int
    final_hidden: str  # "post_norm" or "pre_norm"
    architecture: str
    chunks: list[list[int]] = field(default_factory=list)  # [[prefix_len, extend_len], ...] in arrival order
    model_path: str = ""
    sglang_version: str = ""
    hsextract_version: str = ""
    attn_dp_rank: int = 0
    completed_at: float = 0.0
    version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DoneMarker:
        known = {f for f in cls.__dataclass_fields__}
        missing = [f for f in ("rid", "prompt_len", "num_aux", "hidden_size", "dtype") if f not in data]
        if missing:
            raise StagingError(f"done marker lacks {missing}")
        return cls(**{k: v for k, v in data.items() if k in known})


def rid_dir(dump_dir: str | Path, rid: str) -> Path:
    return Path(dump_dir) / rid


def write_done_marker(dump_dir: str | Path, marker: DoneMarker) -> None:
    """Write ``done.json`` atomically: the drain sees either no marker or a whole one."""
    d = rid_dir(dump_dir, marker.rid)
    tmp = d / f".{DONE_FILE}.tmp"
    tmp.write_text(marker.to_json())
    os.replace(tmp, d / DONE_FILE)


def read_done_marker(path: str | Path) -> DoneMarker:
    """Read a dump directory's ``done.json``; raise StagingError naming the file if it is unusable."""
    p = Path(path)
    if p.is_dir():
        p = p / DONE_FILE
    try:
        return DoneMarker.from_dict(json.loads(p.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise StagingError(f"{p}: unreadable done marker ({exc})") from exc


def iter_dump_dirs(dump_dir: str | Path) -> Iterator[Path]:
    """Every request directory under the dump dir (complete or not), skipping reserved names."""
    root = Path(dump_dir)
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False) and not entry.name.startswith(("_", ".")):
            yield Path(entry.path)


def iter_complete(dump_dir: str | Path) -> Iterator[Path]:
    """Request directories whose done marker exists, i.e. dumps ready to drain."""
    for d in iter_dump_dirs(dump_dir):
        if (d / DONE_FILE).exists():
            yield d


@dataclass
class StagedStates:
    """The tensors of one staged request."""

    hidden: torch.Tensor  # [P, K + 1, H]
    input_ids: torch.Tensor  # int64 [P]
    raw: bytearray | None = None  # the whole file, for a byte-exact copy


def parse_header(buf: bytes | bytearray, path: str | Path = "?") -> tuple[dict[str, Any], int]:
    """Parse a safetensors header; return (header dict, data start offset)."""
    if len(buf) < 8:
        raise StagingError(f"{path}: truncated ({len(buf)} bytes, not even a header length)")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > 100_000_000 or 8 + n > len(buf):
        raise StagingError(f"{path}: truncated or corrupt header (claims {n} bytes, file has {len(buf)})")
    try:
        header = json.loads(buf[8 : 8 + n])
    except ValueError as exc:
        raise StagingError(f"{path}: header is not JSON ({exc})") from exc
    return header, 8 + n


def read_states(path: str | Path) -> StagedStates:
    """Read ``states.safetensors`` into tensors, checking that it is complete and well formed."""
    p = Path(path)
    if p.is_dir():
        p = p / STATES_FILE
    try:
        # A writable buffer: tensors made from it may be modified by the caller without copying again.
        with open(p, "rb") as f:
            buf = bytearray(os.fstat(f.fileno()).st_size)
            f.readinto(buf)
    except OSError as exc:
        raise StagingError(f"{p}: cannot read ({exc})") from exc
    header, start = parse_header(buf, p)
    try:
        h, ids = header["hidden"], header["input_ids"]
        dtype_name_ = _ST_TO_NAME[h["dtype"]]
    except KeyError as exc:
        raise StagingError(f"{p}: header lacks {exc.args[0]!r}") from exc
    end = start + ids["data_offsets"][1]
    if len(buf) < end:
        raise StagingError(f"{p}: truncated: {len(buf)} bytes, header promises {end}")
    torch_dtype = DTYPES[dtype_name_][0]
    mv = memoryview(buf)
    hs, he = h["data_offsets"]
    is_, ie = ids["data_offsets"]
    if he > hs:
        hidden = torch.frombuffer(mv[start + hs : start + he], dtype=torch_dtype).reshape(h["shape"])
    else:
        hidden = torch.empty(h["shape"], dtype=torch_dtype)
    if ie > is_:
        input_ids = torch.frombuffer(mv[start + is_ : start + ie], dtype=torch.int64)
    else:
        input_ids = torch.empty(0, dtype=torch.int64)
    return StagedStates(hidden=hidden, input_ids=input_ids, raw=buf)
