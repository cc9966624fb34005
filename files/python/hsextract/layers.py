"""Layer numbering: the draft config's convention versus SGLang's internal one.

Two conventions exist (see the design brief):

* ``eagle``: the draft config's ``eagle_aux_hidden_state_layer_ids``; id ``i`` is the *output* of
  decoder layer ``i`` (Hugging Face ``hidden_states[i + 1]``). Default ``[1, L//2 - 1, L - 4]``,
  ``[1, 29, 57]`` for 61 layers. This is the project's default convention.
* ``sglang``: SGLang's ``model.layers_to_capture``; id ``i`` is the residual stream *entering*
  layer ``i`` (= output of layer ``i - 1``). ``[2, 30, 58]`` for 61 layers.

SGLang's own ``set_eagle3_layers_to_capture`` adds +1 always for Llama/Qwen but, for DeepSeek,
only when the first id is 1. The project never calls it: it translates ids itself and sets
``layers_to_capture`` directly, so the same configuration means the same rows on every model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from hsextract.errors import LayerConfigError

Convention = Literal["eagle", "sglang"]
CONVENTIONS: tuple[str, ...] = ("eagle", "sglang")


@dataclass(frozen=True)
class CaptureLayers:
    """The aux layers of one run, in both conventions (recorded in every manifest)."""

    eagle_aux_hidden_state_layer_ids: tuple[int, ...]
    sglang_layers_to_capture: tuple[int, ...]
    num_hidden_layers: int

    def as_dict(self) -> dict[str, object]:
        return {
            "eagle_aux_hidden_state_layer_ids": list(self.eagle_aux_hidden_state_layer_ids),
            "sglang_layers_to_capture": list(self.sglang_layers_to_capture),
            "num_hidden_layers": self.num_hidden_layers,
        }


def default_eagle_ids(num_hidden_layers: int) -> list[int]:
    """EAGLE-3's default aux layers in the output-of-layer convention: [1, L//2 - 1, L - 4]."""
    n = num_hidden_layers
    return [1, n // 2 - 1, n - 4]


def parse_ids(text: str | Sequence[int] | None) -> list[int] | None:
    """Parse "1,29,57" (or a list) into ints; None or "" means "use the default"."""
    if text is None:
        return None
    if isinstance(text, str):
        text = text.strip().strip("[]")
        if not text:
            return None
        try:
            return [int(part) for part in text.replace(" ", "").split(",") if part]
        except ValueError:
            raise LayerConfigError(
                f"aux layer ids {text!r}: expected comma-separated integers such as 1,29,57"
            ) from None
    return [int(x) for x in text]


def resolve(
    ids: Sequence[int] | None,
    num_hidden_layers: int | None,
    convention: str = "eagle",
) -> CaptureLayers:
    """Translate configured aux layer ids into both conventions, validating their range.

    Valid ids leave room for the final hidden state, which is captured separately: ``eagle`` ids
    lie in ``[0, L - 2]`` and ``sglang`` ids in ``[1, L - 1]``. Without the model's depth
    (``num_hidden_layers`` None) only the lower bound and the order are checked, and the ids
    must be given (the default depends on the depth).
    """
    if convention not in CONVENTIONS:
        raise LayerConfigError(f"layer id convention {convention!r}: expected one of {', '.join(CONVENTIONS)}")
    if num_hidden_layers is None:
        if ids is None:
            raise LayerConfigError("aux layer ids: the default needs the model's layer count; give --model")
        n = 1 << 30  # no upper bound known
    else:
        n = int(num_hidden_layers)
    if n < 2:
        raise LayerConfigError(f"model has {n} hidden layers; the capture needs at least 2")
    if ids is None:
        eagle = default_eagle_ids(n)
        source = f"the default [1, L//2-1, L-4] for L={n}"
    else:
        eagle = [i - 1 for i in ids] if convention == "sglang" else list(ids)
        source = f"{convention} ids {list(ids)}"
    if not eagle:
        raise LayerConfigError("aux layer ids: the list is empty; give at least one layer")
    lo, hi = (0, n - 2) if convention == "eagle" else (1, n - 1)
    given = list(ids) if ids is not None else eagle
    bad = [g for g, e in zip(given, eagle, strict=True) if not 0 <= e <= n - 2]
    if bad and num_hidden_layers is None:
        raise LayerConfigError(f"aux layer ids {given} ({convention} convention): {bad} below {lo}, the first valid id")
    if bad:
        raise LayerConfigError(
            f"aux layer ids {given} ({convention} convention) out of range for a model with {n} layers: "
            f"{bad} not in [{lo}, {hi}] (the last layer's output is the final hidden state, captured separately)"
        )
    if len(set(eagle)) != len(eagle) or sorted(eagle) != eagle:
        raise LayerConfigError(f"aux layer ids from {source} must be strictly increasing without repeats, got {given}")
    return CaptureLayers(
        eagle_aux_hidden_state_layer_ids=tuple(eagle),
        sglang_layers_to_capture=tuple(e + 1 for e in eagle),
        num_hidden_layers=n if num_hidden_layers is not None else 0,
    )
