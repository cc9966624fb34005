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

from hsextract.formats.base import (
    Payload,
    Sample,
    SampleShape,
    TokenReader,
    TorchSavePayload,
    empty_rows,
    read_torch_tokens,
    torch_save_bytes,
    torch_slot_groups,
)
from hsextract.formats.stored import StoredSample, byte_rows, load_torch_sample
from hsextract.output.manifest import ManifestEntry, ManifestHeader

GROUP_SIZE = 2000


def _object(input_ids: torch.Tensor, loss_mask: torch.Tensor, aux: torch.Tensor, final: torch.Tensor) -> dict:
    """The file's dict from ids, mask, aux rows [T, K*H] and final rows [T, H] (shared by encode and sizing)."""
    t = input_ids.shape[0]
    return {
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "aux_hidden_state": aux.view(1, t, aux.shape[1]),
        "hidden_state": final.view(1, t, final.shape[1]),
    }


class SpecForgeFormat:
    name = "specforge"
    final_hidden = "post_norm"
    file_pattern = re.compile(r"^rows_\d+-\d+/data_(\d+)\.ckpt$")
    reads_every_pt_file = False  # the reader walks the tree for *.ckpt only

    def relative_path(self, output_index: int) -> str:
        g = (output_index // GROUP_SIZE) * GROUP_SIZE
        return f"rows_{g}-{g + GROUP_SIZE}/data_{output_index}.ckpt"

    def slot_groups(self, slots: int) -> list[tuple[int, int]]:
        """The slots stored as separate tensors: the drain reads the rows straight into them."""
        return torch_slot_groups(slots)

    def encode(self, sample: Sample) -> Payload:
        k = sample.num_aux
        return TorchSavePayload(
            _object(
                sample.input_ids.to(torch.int64).clone(),
                sample.loss_mask.to(torch.int64).clone(),
                sample.slots(0, k),
                sample.slots(k, k + 1),
            )
        )

    def sample_file_bytes(self, shape: SampleShape) -> int:
        return torch_save_bytes(lambda s: _object(*empty_rows(s)), shape, self.name)

    def read_tokens(self, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
        return read_torch_tokens(path)

    def stored_shapes(self, shape: SampleShape) -> dict[str, list[int]]:
        """The shapes `encode` gives a sample of this shape, by tensor name."""
        t, k, h = shape.tokens, shape.num_aux, shape.hidden_size
        return {"input_ids": [t], "loss_mask": [t], "aux_hidden_state": [1, t, k * h], "hidden_state": [1, t, h]}

    def read_stored(self, path: Path) -> StoredSample:
        obj, shapes = load_torch_sample(path, dict.fromkeys(self.stored_shapes(SampleShape(0, 1, 1)), False))
        return StoredSample(
            shapes,
            obj["input_ids"].numpy(),
            lambda: [byte_rows(obj["aux_hidden_state"][0]), byte_rows(obj["hidden_state"][0])],
        )

    def finalize(
        self,
        output_dir: Path,
        header: ManifestHeader,
        entries: Sequence[ManifestEntry],
        tokens: TokenReader | None = None,
    ) -> list[Path]:
        # The reader discovers files by walking the tree: no dataset-level file is needed.
        return []
