"""ModelOpt's offline EAGLE-3 features (nvidia-modelopt 0.47.0): ``{i}.pt`` per sample.

Each file is a ``torch.save`` dict, as ModelOpt's own dump scripts write it
(``examples/speculative_decoding/collect_hidden_states/compute_hidden_states_hf.py``) and as its
reader ``modelopt.torch.speculative.eagle.utils.OfflineSupervisedDataset`` loads it
(``torch.load(weights_only=True)``)::

    input_ids          int64 [T]
    hidden_states      bf16  [T, H]     final hidden state, POST-norm (the reader's default: it
                                        re-applies the final norm only when the file carries
                                        ``hidden_states_prenorm=True``, which these files do not)
    aux_hidden_states  bf16  [T, K*H]   aux layers concatenated low -> high on the last dim
    loss_mask          int64 [T]        1 = train on this token (read with ``answer_only_loss``)
    conversation_id    int              the sample's dataset index (the line of the dataset)

ModelOpt's scripts name a file after its conversation id; here, as in every format, files are
numbered by the contiguous output index ``i`` and the manifest maps ``i`` to the dataset index
(which is also in the file). The trainer's data module (``examples/speculative_decoding/
eagle_utils.py`` ``make_speculative_data_module``) takes every ``*.pt`` file under
``offline_data_path`` recursively, so nothing else written here may end in ``.pt``.
ModelOpt's default aux layers, HF ``hidden_states[i]`` for i in (2, L//2, L-3), are SGLang's
``layers_to_capture`` and hsextract's default EAGLE-3 layers ``[1, L//2-1, L-4]``.
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


def _object(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, aux: torch.Tensor, final: torch.Tensor, conversation_id: int
) -> dict:
    """The file's dict (shared by encode and sizing; key order as ModelOpt's dump scripts write it)."""
    return {
        "input_ids": input_ids,
        "hidden_states": final,
        "aux_hidden_states": aux,
        "loss_mask": loss_mask,
        "conversation_id": int(conversation_id),
    }


class ModelOptFormat:
    name = "modelopt"
    final_hidden = "post_norm"
    file_pattern = re.compile(r"^(\d+)\.pt$")
    reads_every_pt_file = True  # make_speculative_data_module: Path(offline_data_path).rglob("*.pt")

    def relative_path(self, output_index: int) -> str:
        return f"{output_index}.pt"

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
                sample.dataset_index,
            )
        )

    def sample_file_bytes(self, shape: SampleShape) -> int:
        return torch_save_bytes(lambda s: _object(*empty_rows(s), s.dataset_index), shape, self.name)

    def read_tokens(self, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
        return read_torch_tokens(path)

    def stored_shapes(self, shape: SampleShape) -> dict[str, list[int]]:
        """The shapes `encode` gives a sample of this shape, by tensor name."""
        t, k, h = shape.tokens, shape.num_aux, shape.hidden_size
        return {"input_ids": [t], "hidden_states": [t, h], "aux_hidden_states": [t, k * h], "loss_mask": [t]}

    def read_stored(self, path: Path) -> StoredSample:
        obj, shapes = load_torch_sample(path, dict.fromkeys(self.stored_shapes(SampleShape(0, 1, 1)), False))
        cid = obj.get("conversation_id")
        return StoredSample(
            shapes,
            obj["input_ids"].numpy(),
            lambda: [byte_rows(obj["aux_hidden_states"]), byte_rows(obj["hidden_states"])],
            dataset_index=cid if isinstance(cid, int) else None,
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
