"""speculators 0.9.0: ``hidden_states/hs_{i}.safetensors`` plus the Arrow dataset beside it.

::

    <output>/                          datasets.save_to_disk (state.json, dataset_info.json, data-*.arrow)
                                       columns input_ids, loss_mask, seq_len; format "torch"
    <output>/hidden_states/hs_{i}.safetensors
        hidden_states  [T, K + 1, H]   aux layers, then the final hidden state PRE-norm
        token_ids      int64 [T]       must equal row i's input_ids or the reader drops the sample
        loss_mask      int64 [T]       not read by the trainer; keeps each file self-contained so
                                       the Arrow dataset can always be rebuilt from the files

``i`` is the Arrow row index, so samples are numbered by a contiguous output sequence (the
manifest's output index). The staged rows already have the ``[T, K + 1, H]`` layout, so a sample
is written with a new header and the staged bytes, no tensor copy.

A set of FP8 rows (``--precision fp8``, hsextract.fp8) holds, in the layout hs_connectors 0.9's
``FP8Transfer`` reads (speculators' ``--hidden-states-backend fp8``)::

        hidden_states         float8_e4m3fn [T, K + 1, H]
        token_ids, loss_mask  int64 [T], as above
        hidden_states_scales  float32 [T, 1, 1]   one scale per token; the reader's rows are
                                                  hidden_states.to(bf16) * scales.to(bf16)

The writer writes what the drain hands it (rows of the dtype of `Sample.hidden`, quantized by the
drain, with `Sample.scales`); the scales come last so that the FP8 rows stream through piece by
piece before every scale is known.

The Arrow dataset is brought up to the manifest at finalize (and by the daemon when idle): only
the new rows are read, appended to the last data file or written as a new one. Data files get
build-unique names and ``state.json`` is replaced last, so a reader sees either the old dataset
or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsextract import fp8
from hsextract.durable import atomic_write_bytes, fsync_dir
from hsextract.formats.base import ChunksPayload, Payload, Sample, SampleShape, SourceRange, TokenReader, tensor_bytes
from hsextract.formats.stored import StoredSample
from hsextract.output.layout import ARROW_BUILD_PREFIX, arrow_build_dir, state_dir
from hsextract.output.manifest import ManifestEntry, ManifestHeader
from hsextract.staging.dumps import DTYPES

HS_DIR = "hidden_states"


def safetensors_header(tensors: Sequence[tuple[str, str, list[int], int]]) -> bytes:
    """A safetensors header for (name, dtype code, shape, byte length) laid out back to back."""
    meta: dict[str, object] = {}
    off = 0
    for name, dtype, shape, nbytes in tensors:
        meta[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nbytes]}
        off += nbytes
    body = json.dumps(meta, separators=(",", ":")).encode()
    body += b" " * ((-(8 + len(body))) % 8)
    return struct.pack("<Q", len(body)) + body


# safetensors' own readers refuse a header past 100 MB; ours are a few hundred bytes.
_MAX_HEADER = 100 << 20


def read_safetensors_header(path: Path) -> tuple[dict[str, Any], int, int]:
    """The header of a safetensors file, where its data starts, and the file's size (ValueError when it
    is not a safetensors file)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes: too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, _MAX_HEADER):
            raise ValueError(f"its header claims {n} bytes, the file has {size}")
        meta = json.loads(f.read(n))
    if not isinstance(meta, dict):
        raise ValueError("its header is not a JSON object")
    return meta, 8 + n, size


def _mapped(
    path: Path, meta: dict[str, Any], name: str, start: int, size: int, shape: tuple[int, ...], dtype: Any
) -> np.ndarray:
    """Tensor `name` of a safetensors file as a read-only map of `shape` in `dtype` (uint8 for raw rows)."""
    off = meta[name]["data_offsets"]
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if off[1] - off[0] != nbytes or start + off[1] > size:
        raise ValueError(f"{name}'s data_offsets {off} do not hold {nbytes} bytes inside the file")
    if nbytes == 0:
        return np.zeros(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=start + off[0], shape=shape)


FP8_CODE = "F8_E4M3"  # safetensors' name of float8_e4m3fn


def _codes() -> dict[torch.dtype, tuple[str, int]]:
    """Each dtype the files hold: its safetensors code and element size (the staged dtypes, and FP8)."""
    return {**{dt: (code, size) for _, (dt, code, size) in DTYPES.items()}, fp8.DTYPE: (FP8_CODE, 1)}


def _header(tokens: int, slots: int, hidden_size: int, dtype: torch.dtype) -> tuple[bytes, int]:
    """The file's safetensors header and the byte count of its hidden rows (shared by encode and sizing):
    FP8 rows (`dtype` float8_e4m3fn) have their scales after the token ids."""
    code, elem = _codes()[dtype]
    hidden_nbytes = tokens * slots * hidden_size * elem
    tensors = [
        ("hidden_states", code, [tokens, slots, hidden_size], hidden_nbytes),
        ("token_ids", "I64", [tokens], 8 * tokens),
        ("loss_mask", "I64", [tokens], 8 * tokens),
    ]
    if dtype == fp8.DTYPE:
        tensors.append((fp8.SCALES_KEY, "F32", [tokens, 1, 1], 4 * tokens))
    return safetensors_header(tensors), hidden_nbytes


class SpeculatorsFormat:
    name = "speculators"
    final_hidden = "pre_norm"
    # The file body is the staged bytes unchanged: the drain streams them (and checks them on the way).
    streams_staged = True
    file_pattern = re.compile(rf"^{HS_DIR}/hs_(\d+)\.safetensors$")
    reads_every_pt_file = False  # ArrowDataset opens hs_{row}.safetensors by row number only

    def relative_path(self, output_index: int) -> str:
        return f"{HS_DIR}/hs_{output_index}.safetensors"

    def sample_file_bytes(self, shape: SampleShape) -> int:
        header, hidden_nbytes = _header(shape.tokens, shape.num_aux + 1, shape.hidden_size, shape.dtype)
        scales = 4 * shape.tokens if shape.dtype == fp8.DTYPE else 0
        return len(header) + hidden_nbytes + 16 * shape.tokens + scales

    def read_tokens(self, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return f.get_tensor("token_ids"), f.get_tensor("loss_mask")

    def stored_shapes(self, shape: SampleShape) -> dict[str, list[int]]:
        """The shapes `encode` gives a sample of this shape, by tensor name."""
        t = shape.tokens
        shapes = {"hidden_states": [t, shape.num_aux + 1, shape.hidden_size], "token_ids": [t], "loss_mask": [t]}
        if shape.dtype == fp8.DTYPE:
            shapes[fp8.SCALES_KEY] = [t, 1, 1]
        return shapes

    def read_stored(self, path: Path) -> StoredSample:
        """The sample's tensors mapped from the file, after its header (no tensor is read here). The rows
        of an FP8 file are each token's FP8 row followed by its float32 scale (what its fingerprint is of)."""
        meta, start, size = read_safetensors_header(path)
        shapes = {
            name: list(meta[name]["shape"])
            for name in ("hidden_states", "token_ids", "loss_mask", fp8.SCALES_KEY)
            if isinstance(meta.get(name), dict)
        }
        t = int((shapes.get("token_ids") or [0])[0])
        ids = _mapped(path, meta, "token_ids", start, size, (t,), np.dtype("<i8"))
        code = meta["hidden_states"]["dtype"] if isinstance(meta.get("hidden_states"), dict) else None

        def scales() -> np.ndarray:  # float32 [T, 1, 1], once the shapes are right
            return _mapped(path, meta, fp8.SCALES_KEY, start, size, (t, 1, 1), np.dtype("<f4"))

        def pieces() -> list[np.ndarray]:
            rows, slots, hidden = shapes["hidden_states"]
            elem = next((n for c, n in _codes().values() if c == code), None)
            if elem is None:
                raise ValueError(f"hidden_states has dtype {code!r}, not one the drain writes")
            out = [_mapped(path, meta, "hidden_states", start, size, (rows, slots * hidden * elem), np.uint8)]
            if code == FP8_CODE:
                out.append(scales().reshape(rows, 1).view(np.uint8))
            return out

        return StoredSample(shapes, ids, pieces, scales=scales if code == FP8_CODE else None)

    def encode(self, sample: Sample) -> Payload:
        mask = tensor_bytes(sample.loss_mask.to(torch.int64))
        t, slots, h = sample.hidden.shape
        header, hidden_nbytes = _header(t, slots, h, sample.hidden.dtype)
        ids_nbytes = 8 * sample.tokens
        body: list[bytes | memoryview | SourceRange]
        if sample.staged is not None and sample.staged.length == hidden_nbytes + ids_nbytes:
            # The staged rows + ids (or the FP8 rows the drain made of them) are this file's layout.
            body = [sample.staged]
        else:
            body = [tensor_bytes(sample.hidden), tensor_bytes(sample.input_ids.to(torch.int64))]
        if sample.hidden.dtype != fp8.DTYPE:
            return ChunksPayload([header, *body, mask])
        scales = sample.scales
        if scales is None:
            raise ValueError(f"{sample.rid}: FP8 rows without their scales")
        return ChunksPayload([header, *body, mask, scales if isinstance(scales, SourceRange) else tensor_bytes(scales)])

    def finalize(
        self,
        output_dir: Path,
        header: ManifestHeader,
        entries: Sequence[ManifestEntry],
        tokens: TokenReader | None = None,
    ) -> list[Path]:
        return [build_arrow_dataset(output_dir, entries, tokens)]


def _read_row(path: Path) -> tuple[list[int], list[int]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        ids = f.get_tensor("token_ids").tolist()
        mask = f.get_tensor("loss_mask").tolist() if "loss_mask" in f.keys() else [1] * len(ids)  # noqa: SIM118
    return ids, mask


# The last data file takes new rows until it is this big; then a new file starts. Each finalize
# thus rewrites at most one bounded file plus the new rows, never the whole dataset (a run of
# millions of samples has tens of GB of token ids).
TAIL_FILE_LIMIT = 256 << 20


def _features():  # -> datasets.Features
    import datasets

    return datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int64")),
            "loss_mask": datasets.Sequence(datasets.Value("int64")),
            "seq_len": datasets.Value("int64"),
        }
    )


def _current_files(out: Path, rows: Sequence[ManifestEntry]) -> tuple[list[str], int]:
    """The data files of the dataset in `out` and their row count, if they hold exactly the first
    rows of the manifest.

    Anything else (no dataset yet, a missing or unreadable file, more rows than the manifest has,
    lengths that differ from the manifest's) gives ([], 0), so the dataset is rebuilt from the files.
    """
    import datasets

    try:
        state = json.loads((out / "state.json").read_text())
        names = [item["filename"] for item in state["_data_files"]]
        lengths: list[int] = []
        for name in names:
            lengths.extend(datasets.Dataset.from_file(str(out / name))["seq_len"])
    except (OSError, ValueError, KeyError, TypeError):  # pyarrow's errors derive from OSError / ValueError
        return [], 0
    if len(lengths) > len(rows) or lengths != [e.tokens for e in rows[: len(lengths)]]:
        return [], 0
    return names, len(lengths)


def build_arrow_dataset(
    output_dir: str | Path, entries: Sequence[ManifestEntry], tokens: TokenReader | None = None
) -> Path:
    """Bring the Arrow dataset of `output_dir` up to its manifest entries; return state.json's path.

    Only the rows the dataset lacks are read from their files. They are appended to the last data
    file while it is under TAIL_FILE_LIMIT, else written as a new file. The new files get
    build-unique names and ``state.json``, which lists them, is replaced last: a reader sees the old
    dataset or the new one, never a mix. `tokens` reads a sample's ids and mask where its file is
    not in `output_dir` (a set in a bucket: hsextract.objectstore.tokens).
    """
    import datasets

    datasets.disable_progress_bars()
    out = Path(output_dir)
    remove_arrow_builds(out)  # an earlier build that failed (a full volume, a kill) left its directory
    rows = sorted(entries, key=lambda e: e.output_index)
    if [e.output_index for e in rows] != list(range(len(rows))):
        raise ValueError(f"{out}: manifest output indices are not contiguous from 0; cannot number Arrow rows")
    kept, covered = _current_files(out, rows)
    if kept and covered == len(rows):
        return out / "state.json"
    tail: list[datasets.Dataset] = []
    if kept and (out / kept[-1]).stat().st_size < TAIL_FILE_LIMIT:
        tail = [datasets.Dataset.from_file(str(out / kept.pop()))]
    new: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    for e in rows[covered:]:
        ids, mask = _read_row(out / e.file) if tokens is None else (t.tolist() for t in tokens(e))
        new["input_ids"].append(ids)
        new["loss_mask"].append(mask)
        new["seq_len"].append(len(ids))
    part = datasets.Dataset.from_dict(new, _features())
    ds = datasets.concatenate_datasets([*tail, part]) if tail else part
    ds.set_format("torch")
    build_id = f"{time.time_ns():x}"
    build = arrow_build_dir(out, build_id)
    new_files: list[str] = []
    try:
        listed = _switch_to_build(out, ds, build, build_id, kept, new_files)
    except BaseException:
        # Nothing of a failed build stays: state.json still lists the old files, so the new ones
        # are not the dataset's (the next build would remove them too).
        for name in new_files:
            with contextlib.suppress(FileNotFoundError):
                (out / name).unlink()
        raise
    finally:
        shutil.rmtree(build, ignore_errors=True)
    for old in out.glob("data-*.arrow"):
        if old.name not in listed:
            with contextlib.suppress(FileNotFoundError):
                old.unlink()
    return out / "state.json"


def remove_arrow_builds(out: Path) -> None:
    """Remove the build directories of earlier Arrow builds (only one process writes a set at a time:
    hsextract.output.lock)."""
    for old in state_dir(out).glob(f"{ARROW_BUILD_PREFIX}*"):
        shutil.rmtree(old, ignore_errors=True)


def _switch_to_build(
    out: Path, ds: Any, build: Path, build_id: str, kept: list[str], new_files: list[str]
) -> list[str]:
    """Save `ds` in `build`, move its data files into `out` under build-unique names (appended to
    `new_files` as they arrive), then replace ``state.json``; the data files now listed."""
    build.parent.mkdir(parents=True, exist_ok=True)
    ds.save_to_disk(str(build))
    state = json.loads((build / "state.json").read_text())
    for item in state["_data_files"]:
        src = build / item["filename"]
        name = f"data-{build_id}-{item['filename'].removeprefix('data-')}"
        with open(src, "rb") as f:
            os.fsync(f.fileno())
        os.replace(src, out / name)
        new_files.append(name)
    fsync_dir(out)
    listed = [*kept, *new_files]
    state["_data_files"] = [{"filename": name} for name in listed]
    atomic_write_bytes(out / "dataset_info.json", (build / "dataset_info.json").read_bytes())
    # state.json names the data files: replacing it is the atomic switch to the new dataset.
    atomic_write_bytes(out / "state.json", (json.dumps(state, indent=2, sort_keys=True) + "\n").encode())
    return listed
