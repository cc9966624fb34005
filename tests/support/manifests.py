"""A manifest header for tests that need a set's header but no model: a tiny Llama's layout (hidden
64, 8 layers, three aux layers), speculators format. Each test adds what it checks."""

from __future__ import annotations

from typing import Any

from hsextract.output.manifest import ManifestHeader


def tiny_header(**fields: Any) -> ManifestHeader:
    """The tiny layout's header, with `fields` set on top (a run id, the model's identity, ...)."""
    base: dict[str, Any] = {
        "format": "speculators",
        "final_hidden": "pre_norm",
        "dtype": "bfloat16",
        "hidden_size": 64,
        "num_aux": 3,
        "eagle_aux_hidden_state_layer_ids": [1, 3, 4],
        "sglang_layers_to_capture": [2, 4, 5],
        "num_hidden_layers": 8,
    }
    return ManifestHeader(**{**base, **fields})
