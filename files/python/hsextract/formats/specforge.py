"""SpecForge 0.2.0 offline features: ``rows_{a}-{b}/data_{i}.ckpt``.

Each file is a ``torch.save`` dict of plain tensors (the reader maps it with ``mmap=True``, which
needs the default zip format)::

    input_ids         int64 [T]
    loss_mask         int64 [T]          1 = train on this token
    aux_hidden_state  bf16  [1, T, K*H]  aux layers concatenated low -> high on the last dim
    hidden_state      bf16  [1, T, H]    final hidden state, post-norm (what SGLang's logits see)

Samples are unpadded (SpecForge's own tool stores batch-padded rows). Files are grouped 2000 per
``rows_*`` directory like SpecForge's ``--file-group-size``; the reader walks the tree and never
parses the directory names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import torch

from hsextract.formats.base import Payload, Sample, TorchSavePayload, copy_slots
from hsextract.formats.manifest import ManifestEntry, ManifestHeader

GROUP_SIZE = 2000


class SpecForgeFormat:
    name = "specforge"
    final_hidden = "post_norm"
    file_pattern = re.compile(r"^rows_\d+-\d+/data_(\d+)\.ckpt$")

    def relative_path(self, output_index: int) -> str:
        g = (output_index // GROUP_SIZE) * GROUP_SIZE
        return f"rows_{g}-{g + GROUP_SIZE}/data_{output_index}.ckpt"

    def encode(self, sample: Sample) -> Payload:
        t, k = sample.tokens, sample.num_aux
        hidden = sample.hidden
        obj = {
            "input_ids": sample.input_ids.to(torch.int64).clone(),
            "loss_mask": sample.loss_mask.to(torch.int64).clone(),
            "aux_hidden_state": copy_slots(hidden, 0, k).view(1, t, k * hidden.shape[2]),
            "hidden_state": copy_slots(hidden, k, k + 1).view(1, t, hidden.shape[2]),
        }
        return TorchSavePayload(obj)

    def finalize(self, output_dir: Path, header: ManifestHeader, entries: Sequence[ManifestEntry]) -> list[Path]:
        # The reader discovers files by walking the tree: no dataset-level file is needed.
        return []
