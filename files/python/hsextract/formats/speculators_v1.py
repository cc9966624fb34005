"""speculators v1 (the original pipeline's format, read by speculators <= 0.7.0.x ``--legacy-data``).

::

    <output>/data_{i}.pt           torch.save dict: input_ids int64 [T], loss_mask int64 [T],
                                   hidden_states = list of K + 1 tensors [T, H], the last one the
                                   final hidden state (pre-norm)
    <output>/sample_lengths.json   {"<i>": T}: the reader's length-grouped batching; on a missing
                                   key it silently guesses from file sizes, so it must be complete
    <output>/data_config.json      what produced the data (model, layer ids, norm placement)

The reader takes EVERY file under the tree whose name ends in "pt" (no dot needed), so nothing
else written here may end that way (temporary files end in ".tmp"). ``i`` is the contiguous
output index.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from hsextract.durable import atomic_write_bytes
from hsextract.formats.base import (
    Payload,
    Sample,
    SampleShape,
    TokenReader,
    TorchSavePayload,
    read_torch_tokens,
    torch_save_bytes,
)
from hsextract.formats.stored import StoredSample, byte_rows, load_torch_sample
from hsextract.output.manifest import ManifestEntry, ManifestHeader

LENGTHS_FILE = "sample_lengths.json"
CONFIG_FILE = "data_config.json"


def _object(input_ids: torch.Tensor, loss_mask: torch.Tensor, layers: list[torch.Tensor]) -> dict:
    """The file's dict from ids, mask and the K + 1 layers [T, H] (shared by encode and sizing)."""
    return {"input_ids": input_ids, "loss_mask": loss_mask, "hidden_states": layers}


def _empty_object(s: SampleShape) -> dict:
    ids = torch.empty(s.tokens, dtype=torch.int64)
    layers = [torch.empty(s.tokens, s.hidden_size, dtype=s.dtype) for _ in range(s.num_aux + 1)]
    return _object(ids, torch.empty(s.tokens, dtype=torch.int64), layers)


class SpeculatorsV1Format:
    name = "speculators-v1"
    final_hidden = "pre_norm"
    file_pattern = re.compile(r"^data_(\d+)\.pt$")
    reads_every_pt_file = True  # SampleFileDataset's list_files: every file whose name ends in "pt"

    def relative_path(self, output_index: int) -> str:
        return f"data_{output_index}.pt"

    def slot_groups(self, slots: int) -> list[tuple[int, int]]:
        """Each layer is a tensor of its own: the drain reads the rows straight into them."""
        return [(j, j + 1) for j in range(slots)]

    def encode(self, sample: Sample) -> Payload:
        hidden = sample.hidden
        return TorchSavePayload(
            _object(
                sample.input_ids.to(torch.int64).clone(),
                sample.loss_mask.to(torch.int64).clone(),
                # One storage per layer: the reader concatenates the list, and a view into a shared
                # storage would make torch.save write every layer for each of them.
                [sample.slots(j, j + 1) for j in range(hidden.shape[1])],
            )
        )

    def sample_file_bytes(self, shape: SampleShape) -> int:
        return torch_save_bytes(_empty_object, shape, self.name)

    def read_tokens(self, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
        return read_torch_tokens(path)

    def stored_shapes(self, shape: SampleShape) -> dict[str, list[int]]:
        """The shapes `encode` gives a sample of this shape, by tensor name (``hidden_states[j]``: layer j)."""
        t, h = shape.tokens, shape.hidden_size
        return {"input_ids": [t], "loss_mask": [t], **{f"hidden_states[{j}]": [t, h] for j in range(shape.num_aux + 1)}}

    def read_stored(self, path: Path) -> StoredSample:
        obj, shapes = load_torch_sample(path, {"input_ids": False, "loss_mask": False, "hidden_states": True})
        return StoredSample(shapes, obj["input_ids"].numpy(), lambda: [byte_rows(t) for t in obj["hidden_states"]])

    def finalize(
        self,
        output_dir: Path,
        header: ManifestHeader,
        entries: Sequence[ManifestEntry],
        tokens: TokenReader | None = None,
    ) -> list[Path]:
        out = Path(output_dir)
        lengths = {str(e.output_index): e.tokens for e in sorted(entries, key=lambda e: e.output_index)}
        atomic_write_bytes(out / LENGTHS_FILE, json.dumps(lengths).encode())
        config = {
            "version": "2.0",
            "generator": "hsextract",
            "num_samples": len(lengths),
            "format": {
                "file_pattern": "data_{i}.pt",
                "schema": {
                    "input_ids": "int64 [T]",
                    "loss_mask": "int64 [T]",
                    "hidden_states": f"list of {header.num_aux + 1} x {header.dtype} [T, {header.hidden_size}]",
                },
                "final_hidden": header.final_hidden,
            },
            "model": {"path": header.model_path, "config_sha256": header.model_config_sha256},
            "layer_ids": {
                "eagle_aux_hidden_state_layer_ids": header.eagle_aux_hidden_state_layer_ids,
                "sglang_layers_to_capture": header.sglang_layers_to_capture,
                "num_hidden_layers": header.num_hidden_layers,
            },
            "manifest": asdict(header),
        }
        atomic_write_bytes(out / CONFIG_FILE, (json.dumps(config, indent=2) + "\n").encode())
        return [out / LENGTHS_FILE, out / CONFIG_FILE]
