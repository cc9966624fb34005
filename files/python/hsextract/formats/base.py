"""What every format writer gets and provides.

A writer is pure: it turns a validated `Sample` into a `Payload` (the bytes of one file, produced
into a sink) and names the file for an output index. Durability, numbering and the manifest
belong to the drain, not to the formats. Payloads stream into the sink, so no format builds its
whole file in memory, and staged bytes that go out unchanged are sent by the kernel (`SourceRange`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from hsextract.formats.manifest import ManifestEntry, ManifestHeader


@dataclass
class SourceRange:
    """Bytes to take unchanged from the staged file: `length` bytes at `offset` of `fd`, mapped as `view`.

    The sink goes through them piece by piece: `check` (if set) sees each piece of the first
    `check_len` bytes (the drain's finite-value check), the hash reads the same piece while it is
    still in the CPU cache, and the kernel sends it to the output file (``sendfile``, as ``cp``
    does), so the bytes are never copied through user memory.
    """

    fd: int
    offset: int
    length: int
    view: memoryview
    check: Callable[[memoryview, int], None] | None = None  # (piece, byte offset in the range)
    check_len: int = 0


@dataclass
class Sample:
    """One validated sample: what the server ran and what the client asked for."""

    rid: str
    dataset_index: int
    input_ids: torch.Tensor  # int64 [T]
    loss_mask: torch.Tensor  # int64 [T]
    hidden: torch.Tensor  # [T, K + 1, H]: K aux layers, then the final hidden state
    # The staged bytes of `hidden` followed by `input_ids`, when they come from a mapped dump.
    staged: SourceRange | None = None

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_aux(self) -> int:
        return int(self.hidden.shape[1]) - 1


class Sink(Protocol):
    def write(self, data: Any) -> int: ...

    def copy_range(self, src: SourceRange) -> None: ...


class Payload(Protocol):
    def write_to(self, sink: Sink) -> None: ...


@dataclass
class ChunksPayload:
    """A file made of byte chunks and staged ranges, in order."""

    chunks: Sequence[bytes | memoryview | SourceRange]

    def write_to(self, sink: Sink) -> None:
        for c in self.chunks:
            if isinstance(c, SourceRange):
                sink.copy_range(c)
            else:
                sink.write(c)


@dataclass
class TorchSavePayload:
    """A ``torch.save`` file (default zip format, so readers can ``mmap`` it), streamed into the sink."""

    obj: Any

    def write_to(self, sink: Sink) -> None:
        torch.save(self.obj, sink)


def copy_slots(hidden: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Slots [start, stop) of every row of `hidden` [T, S, H], as a new [T, (stop - start) * H] tensor.

    The copy owns its memory (``torch.save`` of a view would write the whole staged storage).
    It is made by numpy into numpy's allocation: numpy asks the kernel for huge pages for large
    arrays, and torch's own copy of these strided rows into a fresh ``torch.empty`` ran at a
    third of the speed, most of it faulting in new 4 KiB pages (measured: 1.5 versus 4.8 GB/s).
    """
    import numpy as np

    t, s, h = hidden.shape
    rows = hidden.reshape(t, s * h).view(torch.uint8)  # a view: the staged rows are contiguous
    w = rows.shape[1] // s  # bytes per slot
    out = np.empty((t, (stop - start) * w), dtype=np.uint8)
    if out.size:
        np.copyto(out, rows[:, start * w : stop * w].numpy(), casting="no")
    return torch.from_numpy(out).view(hidden.dtype)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a tensor (no copy when it is contiguous), for any dtype including bf16."""
    t = t.contiguous()
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


class OutputFormat(Protocol):
    name: str
    final_hidden: str  # where this format's trainer expects the final hidden state
    # Matches the file names this format writes, with the output index as group 1 (orphan scan).
    file_pattern: re.Pattern[str]

    def relative_path(self, output_index: int) -> str:
        """Where sample `output_index` lives, relative to the output directory."""
        ...

    def encode(self, sample: Sample) -> Payload:
        """The file's contents."""
        ...

    def finalize(self, output_dir: Path, header: ManifestHeader, entries: Sequence[ManifestEntry]) -> list[Path]:
        """Write the dataset-level files the reader needs; return the paths written."""
        ...
