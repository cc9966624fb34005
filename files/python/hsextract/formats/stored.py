"""A written sample file read back as what it holds: the shapes it declares, its token ids, its rows.

A file's size and checksum say only that it is the file its manifest row recorded, not that it
is the row's sample: a row edited to name another sample's file, with that file's size and
checksum, passes both. What a file holds of its sample (its token count, the dataset index
ModelOpt keeps, the rows whose fingerprint the row recorded) is read through `StoredSample`,
which each format builds from its own layout (`OutputFormat.read_stored`) without reading the
rows into memory: they are mapped, and hsextract.formats.sample_check reads them a piece at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class StoredSample:
    """One sample file as read back (see the module docstring)."""

    shapes: dict[str, list[int]]  # each tensor's shape as the file declares it, by name
    input_ids: np.ndarray  # int64 [T]
    # The rows' bytes as pieces uint8 [T, w_i] whose concatenation along each row is the staged row
    # (the aux layers low to high, then the final hidden state); called only once the shapes are right.
    pieces: Callable[[], list[np.ndarray]]
    dataset_index: int | None = None  # where the file records it (ModelOpt's conversation_id)
    # A file of FP8 rows (hsextract.fp8): its scales, float32 [T, 1, 1], mapped when called (once the
    # shapes are right); each row of `pieces` then ends with its token's scale. None: rows as captured.
    scales: Callable[[], np.ndarray] | None = None


def byte_rows(t: Any) -> np.ndarray:
    """A 2-D tensor's bytes as uint8 ``[rows, row bytes]`` (no copy; any dtype, bf16 included)."""
    import torch

    return t.contiguous().view(torch.uint8).numpy()


def load_torch_sample(path: Path, tensors: Mapping[str, bool]) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """A ``torch.save`` sample file mapped (not read), and the shapes of its tensors `tensors` (name ->
    whether it is a list of tensors, each then named ``name[j]``); ValueError when one is missing."""
    import torch

    obj = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    if not isinstance(obj, dict):
        raise ValueError(f"holds a {type(obj).__name__}, not a dict of tensors")
    shapes: dict[str, list[int]] = {}
    for name, is_list in tensors.items():
        value = obj.get(name)
        items = list(value) if is_list and isinstance(value, (list, tuple)) else [value]
        for j, t in enumerate(items):
            key = f"{name}[{j}]" if is_list else name
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"has no tensor {key!r}")
            shapes[key] = list(t.shape)
    return obj, shapes
