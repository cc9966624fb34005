"""The staging layout in /dev/shm: the contract between the capture (writer) and the drain (reader).

::

    <dump_dir>/
      <rid>/states.safetensors   rows of one request; written by the capture, chunk by chunk
      <rid>/done.json            written last, atomically (write a temporary name, then rename)
      <rid>/failed.json          instead of done.json: the capture could not stage this request, and why
      _records/<rid>.json        the client's record of the sample (see hsextract.staging.records)
      _captures/<host>-<pid>.json  each writing capture announces itself: what it writes, and how
                                   (hsextract.staging.announcements)

``states.safetensors`` is a standard safetensors file (no pickle) holding

* ``hidden``    ``[P, K + 1, H]`` in the model dtype: the K aux layers in capture order, then the
  final hidden state (post- or pre-norm, as ``done.json`` says), one row per prompt token;
* ``input_ids`` ``int64 [P]``: the token ids the server actually ran.

With the capture's ``precision: fp8`` (it quantizes on its device, hsextract.fp8), ``hidden`` is
``float8_e4m3fn [P, K + 1, H]`` and a third tensor follows the ids: ``hidden_scales`` ``float32
[P, 1, 1]``, one scale per token, as a speculators FP8 file stores them; ``done.json`` then says
``"precision": "fp8"`` (a bf16 dump's file and marker are the same bytes as before FP8 staging
existed). A reader that knows no FP8 staging cannot misread such a file: its ``hidden`` dtype,
``F8_E4M3``, is none of the staged dtypes it knows, so it refuses the file.

``P`` is the prompt length. The file is created at its full size when the first chunk of a
request arrives and each (chunked-prefill) chunk is written at its row offset, so a request of
any number of chunks is one file and the drain reads one contiguous block per sample. The rows
``[n, K + 1, H]`` are exactly the ``hidden_states`` layout of the speculators format.

``done.json`` exists only once every row of the prompt has been written; a directory without it
is in progress (or abandoned) and is never read as a sample. When the capture cannot stage a
request (a write error, a batch it could not queue, rows it never saw), it writes ``failed.json``
with the reason instead, so the client learns at once that the sample must be sent again: no
request the server answered is ever lost without a word.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hsextract.durable import atomic_write_bytes
from hsextract.errors import StagingError
from hsextract.staging.fs import FILE_MODE, make_dir, plain_name, write_file_atomically
from hsextract.staging.records import ParsedRid, parse_rid

STATES_FILE = "states.safetensors"
DONE_FILE = "done.json"
FAILED_FILE = "failed.json"
FORMAT_VERSION = 1
# Data starts on a 4 KiB boundary so row slices stay page aligned in the file.
_ALIGN = 4096

if TYPE_CHECKING:
    import torch

# The staged dtypes: safetensors code and bytes per element. Torch is imported only where a tensor
# is made (`read_states`, `DTYPES`): the client reads names and markers here and must not pay
# torch's import (seconds) at its start (hsextract.client.startup).
_DTYPE_CODES: dict[str, tuple[str, int]] = {"bfloat16": ("BF16", 2), "float16": ("F16", 2), "float32": ("F32", 4)}
_ST_TO_NAME = {st: name for name, (st, _) in _DTYPE_CODES.items()}
DTYPE_BYTES = {name: size for name, (_, size) in _DTYPE_CODES.items()}  # what a staged element takes
STAGED_PRECISIONS = ("bf16", "fp8")  # how the capture stages the rows: as computed, or quantized (hsextract.fp8)
FP8_CODE = "F8_E4M3"  # the safetensors code of float8_e4m3fn: a staged FP8 file's `hidden`
SCALES_TENSOR = "hidden_scales"  # a staged FP8 file's float32 [P, 1, 1] scales


@functools.cache
def _torch_dtypes() -> dict[str, tuple[torch.dtype, str, int]]:
    import torch

    return {name: (getattr(torch, name), st, size) for name, (st, size) in _DTYPE_CODES.items()}


def __getattr__(name: str) -> Any:
    """``DTYPES`` (name -> torch dtype, safetensors code, bytes), built on first use."""
    if name == "DTYPES":
        return _torch_dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dtype_name(dtype: torch.dtype) -> str:
    """The staging name of a torch dtype ("bfloat16", ...); raise for dtypes the format does not hold."""
    for name, (dt, _, _) in _torch_dtypes().items():
        if dt == dtype:
            return name
    raise StagingError(f"dtype {dtype} cannot be staged; supported: {', '.join(_DTYPE_CODES)}")


@functools.lru_cache(maxsize=1024)  # 4 KiB each: prompt lengths recur, most of all in a stress
def _header_bytes(prompt_len: int, num_slots: int, hidden_size: int, dtype: str, precision: str = "bf16") -> bytes:
    """The safetensors header of a states file of this shape (see `StateFileLayout.header`)."""
    fp8 = precision == "fp8"
    row_bytes = num_slots * hidden_size * (1 if fp8 else _DTYPE_CODES[dtype][1])
    hidden_len = prompt_len * row_bytes
    ids_end = hidden_len + 8 * prompt_len
    meta: dict[str, Any] = {
        "hidden": {
            "dtype": FP8_CODE if fp8 else _DTYPE_CODES[dtype][0],
            "shape": [prompt_len, num_slots, hidden_size],
            "data_offsets": [0, hidden_len],
        },
        "input_ids": {
            "dtype": "I64",
            "shape": [prompt_len],
            "data_offsets": [hidden_len, ids_end],
        },
    }
    if fp8:  # after the ids: a bf16 file's offsets, and its bytes, stay as they were
        meta[SCALES_TENSOR] = {
            "dtype": "F32",
            "shape": [prompt_len, 1, 1],
            "data_offsets": [ids_end, ids_end + 4 * prompt_len],
        }
    meta["__metadata__"] = {"hsextract_staging": str(FORMAT_VERSION)}
    body = json.dumps(meta, separators=(",", ":")).encode()
    total = 8 + len(body)
    pad = (-total) % _ALIGN
    body += b" " * pad
    return struct.pack("<Q", len(body)) + body


@dataclass(frozen=True)
class StateFileLayout:
    """Byte layout of one request's ``states.safetensors`` (shared by writer and reader)."""

    prompt_len: int
    num_slots: int  # K aux layers + 1 final hidden state
    hidden_size: int
    dtype: str = "bfloat16"  # the model's: what the rows are, or with fp8 what they were quantized from
    precision: str = "bf16"  # "fp8": the rows stored as float8_e4m3fn, each token's float32 scale after the ids

    def __post_init__(self) -> None:
        if self.precision not in STAGED_PRECISIONS:
            raise StagingError(f"staged precision {self.precision!r}: expected one of {', '.join(STAGED_PRECISIONS)}")

    @property
    def elem_size(self) -> int:
        """Bytes of one stored element of ``hidden``."""
        return 1 if self.precision == "fp8" else _DTYPE_CODES[self.dtype][1]

    @property
    def scale_bytes(self) -> int:
        """Bytes of one token's scale (0: a bf16 file has none)."""
        return 4 if self.precision == "fp8" else 0

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's hidden rows ([K + 1, H])."""
        return self.num_slots * self.hidden_size * self.elem_size

    @property
    def header(self) -> bytes:
        """The 8-byte length prefix plus the JSON header, padded so data starts aligned (shared by
        every layout of the same shape: the capture asks once per request, and short prompts of one
        length are thousands of requests a minute)."""
        return _header_bytes(self.prompt_len, self.num_slots, self.hidden_size, self.dtype, self.precision)

    @property
    def data_start(self) -> int:
        return len(self.header)

    def hidden_offset(self, row: int) -> int:
        """File offset of row ``row`` of ``hidden``."""
        return self.data_start + row * self.row_bytes

    def ids_offset(self, row: int) -> int:
        """File offset of element ``row`` of ``input_ids``."""
        return self.data_start + self.prompt_len * self.row_bytes + 8 * row

    def scales_offset(self, row: int) -> int:
        """File offset of token ``row``'s scale in ``hidden_scales`` (an FP8 file's; past the ids)."""
        return self.ids_offset(self.prompt_len) + self.scale_bytes * row

    @property
    def file_size(self) -> int:
        return self.scales_offset(self.prompt_len)


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
    # hsextract.fingerprint of the rows and ids as the forward pass computed them ("" from a capture
    # that took none), and the token SGLang's greedy sampler picked after the prompt (-1: not seen).
    fingerprint: str = ""
    greedy_token: int = -1
    # How the rows are staged: "bf16" (as computed, in `dtype`) or "fp8" (quantized by the capture; the
    # fingerprint then of each FP8 row followed by its scale, hsextract.fp8.stored_row_values).
    precision: str = "bf16"

    def to_json(self, shared_json: str | None = None) -> str:
        """The marker as one JSON object.

        The capture writes one per request inside the server, so it encodes the fields that every
        marker of one capture shares once (`shared_json`) and passes them in: only the request's
        own fields are encoded each time.
        """
        chunks = ", ".join(f"[{int(a)}, {int(b)}]" for a, b in self.chunks)
        return (
            f'{{"chunks": [{chunks}], "completed_at": {float(self.completed_at)!r}, '
            f'"fingerprint": "{self.fingerprint}", "greedy_token": {int(self.greedy_token)}, '
            f'"prompt_len": {int(self.prompt_len)}, "rid": {json.dumps(self.rid)}, '
            + (shared_json or self.shared_json())[1:]
        )

    def shared_json(self) -> str:
        """``{"architecture": ..., ...}``: every field but the request's own (rid, prompt length,
        chunks, completion time), which all the markers of one capture have in common."""
        shared = {k: getattr(self, k) for k in _SHARED_FIELDS}
        if self.precision == "bf16":  # a bf16 marker is the bytes it was before FP8 staging existed
            del shared["precision"]
        return json.dumps(shared, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DoneMarker:
        known = {f for f in cls.__dataclass_fields__}
        missing = [f for f in ("rid", "prompt_len", "num_aux", "hidden_size", "dtype") if f not in data]
        if missing:
            raise StagingError(f"done marker lacks {missing}")
        return cls(**{k: v for k, v in data.items() if k in known})


_OWN_FIELDS = ("chunks", "completed_at", "fingerprint", "greedy_token", "prompt_len", "rid")
_SHARED_FIELDS = tuple(sorted(set(DoneMarker.__dataclass_fields__) - set(_OWN_FIELDS)))


def rid_dir(dump_dir: str | Path, rid: str) -> Path:
    """The directory of `rid` in the staging directory; UnsafeEntryError for a rid that is not one
    plain name (it would name another place)."""
    return Path(dump_dir) / plain_name(rid)


def write_done_marker(dump_dir: str | Path, marker: DoneMarker, shared_json: str | None = None) -> None:
    """Write ``done.json`` atomically: the drain sees either no marker or a whole one.

    Plain string paths and file descriptors (no pathlib, no buffered file object): this runs once
    per captured request, inside the server. ``shared_json``: see `DoneMarker.to_json`.
    """
    write_file_atomically(
        f"{os.fspath(dump_dir)}/{plain_name(marker.rid)}/{DONE_FILE}", marker.to_json(shared_json).encode()
    )


def read_done_marker(path: str | Path) -> DoneMarker:
    """Read a dump directory's ``done.json``; raise StagingError naming the file if it is unusable."""
    p = Path(path)
    if p.is_dir():
        p = p / DONE_FILE
    try:
        return DoneMarker.from_dict(json.loads(p.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise StagingError(f"{p}: unreadable done marker ({exc})") from exc


# Why the capture could not stage a request (stable codes, counted by the client).
CAPTURE_WRITE_ERROR = "write_error"  # an I/O error writing the rows (a full /dev/shm, permissions)
CAPTURE_QUEUE_ERROR = "queue_error"  # the batch could not be handed to the writer
CAPTURE_MISSING_ROWS = "missing_rows"  # the first rows were never run (a cached prefix) or tracking dropped them
CAPTURE_BATCH_UNUSABLE = "batch_unusable"  # the forward batch lacked what the capture needs
CAPTURE_FAULT_INJECTED = "fault_injected"  # the test-only fault switch
CAPTURE_WRITER_DIED = "writer_died"  # the capture's writer process died before it wrote the batch
# The host copy of the rows differs from what the forward pass computed (hsextract.fingerprint).
CAPTURE_FINGERPRINT = "fingerprint_mismatch"
# SGLang refused the request before running it and ran a 1-token placeholder in its place.
CAPTURE_SERVER_ABORTED = "server_aborted"


@dataclass
class FailureMarker:
    """What ``failed.json`` records: the capture gave up on this request, and why."""

    rid: str
    reason: str
    detail: str = ""
    at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def write_failed_marker(dump_dir: str | Path, marker: FailureMarker) -> None:
    """Write ``<rid>/failed.json`` atomically, unless the dump is complete already (a done dump stays).

    Through `atomic_write_bytes`, unlike ``done.json``: a failure is rare, not once per request."""
    d = Path(make_dir(dump_dir, marker.rid)[0])
    if (d / DONE_FILE).exists():
        return
    # Not durable: the staging directory is a ramdisk that a reboot empties anyway.
    atomic_write_bytes(d / FAILED_FILE, marker.to_json().encode(), durable=False, mode=FILE_MODE)


def read_failed_marker(path: str | Path) -> FailureMarker | None:
    """The failure marker of a dump directory (or file), None if there is none; unreadable ones say so."""
    p = Path(path)
    if p.is_dir() or not p.name.endswith(".json"):
        p = p / FAILED_FILE
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return FailureMarker(rid=p.parent.name, reason=CAPTURE_WRITE_ERROR, detail=f"unreadable {p}: {exc}")
    if not isinstance(data, dict):
        return FailureMarker(rid=p.parent.name, reason=CAPTURE_WRITE_ERROR, detail=f"{p}: not a JSON object")
    return FailureMarker(
        rid=str(data.get("rid", p.parent.name)),
        reason=str(data.get("reason", "?")),
        detail=str(data.get("detail", "")),
        at=float(data.get("at", 0) or 0),
    )


def iter_dump_dirs(dump_dir: str | Path) -> Iterator[Path]:
    """Every request directory under the dump dir (complete or not), skipping reserved names."""
    root = Path(dump_dir)
    for name in iter_dump_names(root):
        yield root / name


def iter_dump_names(dump_dir: str | Path) -> Iterator[str]:
    """The names of `iter_dump_dirs`, lazily: the drain's early scans stop after a few dumps, and a
    list of the whole directory (thousands of Paths) after every sample cost it a tenth of its time."""
    try:
        it = os.scandir(dump_dir)
    except FileNotFoundError:
        return
    with it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False) and not entry.name.startswith(("_", ".")):
                yield entry.name


def run_dumps(dump_dir: str | Path, run_id: str) -> Iterator[tuple[Path, ParsedRid]]:
    """The run's dumps in staging (complete or not, probes included), each with its parsed rid.

    One definition for everyone who counts them: the drain (what it waits for before a finished
    run ends), the client (what it need not send again) and the client's backpressure (what the
    drain has yet to take). Dumps of other runs sharing the directory are their own drain's.
    """
    for d in iter_dump_dirs(dump_dir):
        p = parse_rid(d.name)
        if p is not None and p.run_id == run_id:
            yield d, p


def staged_indices(dump_dir: str | Path, prefix: str, run_id: str) -> set[int]:
    """Dataset indices of the run whose dump is complete in staging (the drain will write them)."""
    return {
        p.index
        for d, p in run_dumps(dump_dir, run_id)
        if p.prefix == prefix and not p.probe and (d / DONE_FILE).exists()
    }


TRASH_PREFIX = ".trash-"  # dump directories being deleted (dot names are never scanned as dumps)


def discard_dump(d: Path) -> None:
    """Remove a dump directory so that a crash midway cannot leave a half-deleted dump behind.

    The rename to a dot name is atomic and takes the dump out of every scan at once; the dot
    directory is deleted next, or by the drain at its next start if this process dies first.
    """
    import shutil
    import time

    trash = d.parent / f"{TRASH_PREFIX}{d.name}-{time.time_ns()}"
    try:
        os.rename(d, trash)
    except FileNotFoundError:
        return
    # A dump is a few plain files: unlink them and the directory (shutil.rmtree's walk costs the
    # drain more Python per sample than the removal itself); anything else goes through rmtree.
    try:
        for name in os.listdir(trash):
            os.unlink(trash / name)
        os.rmdir(trash)
    except OSError:
        shutil.rmtree(trash, ignore_errors=True)


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
    scales: torch.Tensor | None = None  # float32 [P, 1, 1] of an FP8-staged file (`hidden` float8_e4m3fn)


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
    import torch

    try:
        h, ids = header["hidden"], header["input_ids"]
        torch_dtype = torch.float8_e4m3fn if h["dtype"] == FP8_CODE else _torch_dtypes()[_ST_TO_NAME[h["dtype"]]][0]
    except KeyError as exc:
        raise StagingError(f"{p}: header lacks {exc.args[0]!r}") from exc
    sc = header.get(SCALES_TENSOR)
    end = start + max(ids["data_offsets"][1], sc["data_offsets"][1] if sc else 0)
    if len(buf) < end:
        raise StagingError(f"{p}: truncated: {len(buf)} bytes, header promises {end}")
    mv = memoryview(buf)
    scales = None
    if sc is not None:
        a, b = sc["data_offsets"]
        scales = (
            torch.frombuffer(mv[start + a : start + b], dtype=torch.float32).reshape(sc["shape"]) if b > a else None
        )
        scales = torch.empty(sc["shape"], dtype=torch.float32) if scales is None else scales
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
    return StagedStates(hidden=hidden, input_ids=input_ids, raw=buf, scales=scales)
