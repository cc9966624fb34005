"""What every format writer gets and provides.

A writer is pure: it turns a validated `Sample` into the bytes of one file (a list of chunks, so
large hidden-state buffers go to the disk without another copy) and names the file for an output
index. Durability, numbering and the manifest belong to the drain, not to the formats.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from hsextract.formats.manifest import ManifestEntry, ManifestHeader

Chunk = bytes | memoryview


@dataclass
class Sample:
    """One validated sample: what the server ran and what the client asked for."""

    rid: str
    dataset_index: int
    input_ids: torch.Tensor  # int64 [T]
    loss_mask: torch.Tensor  # int64 [T]
    hidden: torch.Tensor  # [T, K + 1, H]: K aux layers, then the final hidden state

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_aux(self) -> int:
        return int(self.hidden.shape[1]) - 1


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

    def encode(self, sample: Sample) -> Sequence[Chunk]:
        """The file's bytes, as chunks to write in order."""
        ...

    def finalize(self, output_dir: Path, header: ManifestHeader, entries: Sequence[ManifestEntry]) -> list[Path]:
        """Write the dataset-level files the reader needs; return the paths written."""
        ...
