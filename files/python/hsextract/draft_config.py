"""The EAGLE-3 draft config beside a training set: the one file that ties a drafter to the rows.

A drafter trained on the set is served by SGLang, which reads the draft's ``config.json`` and
captures the target's aux hidden states from the layers named in
``eagle_config.eagle_aux_hidden_state_layer_ids``. If those ids do not make SGLang capture the
layers the set was captured from, the drafter sees other features at serving than in training,
and every check of the rows still passes: a one-layer offset costs most of the acceptance. This
module writes the config (``draft_config.json``) from the set's manifest, with the ids in the
form SGLang 0.5.23 turns into the set's own capture layers, and refuses layers SGLang cannot be
told to capture.

How SGLang 0.5.23 turns the draft's ids into the layers it captures (``set_eagle3_layers_to_capture``;
``layers_to_capture`` = the residual stream entering decoder layer i):

* Llama, Qwen2, Qwen3: always ``id + 1`` (the ids are outputs of layers, EAGLE-3's convention);
* DeepSeek-V2/V3 and Kimi-K2.5 (through its DeepSeek language model): ``id + 1`` only when the
  first id is 1, else the ids as they are.

So a DeepSeek set captured at SGLang layers ``[2, 30, 58]`` (the default) gets ``[1, 29, 57]``,
one captured at ``[5, 30, 58]`` gets ``[5, 30, 58]``, and one whose first SGLang layer is 1
cannot be served at all. The tests check this table against SGLang's own functions.

The draft architecture is SGLang's ``LlamaForCausalLMEagle3`` with one decoder layer, the
target's width, heads, rope and vocabulary (the fields SpecForge copies when it generates a
draft config), and ``draft_vocab_size``: what SpecForge (``model.draft_model_config``) and
SGLang (the exported draft's ``config.json``) both read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hsextract.durable import atomic_write_bytes
from hsextract.errors import ConfigError, LayerConfigError
from hsextract.output.manifest import ManifestEntry, ManifestHeader

DRAFT_CONFIG_FILE = "draft_config.json"
SPECFORGE_RUN_FILE = "specforge-train.yaml"
DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"
# SGLang 0.5.23's rule per target architecture: "always" adds one to every id, "if_first_is_1"
# adds one only when the first id is 1 (DeepSeek's set_eagle3_layers_to_capture).
PLUS_ONE_RULES: dict[str, str] = {
    "LlamaForCausalLM": "always",
    "Qwen2ForCausalLM": "always",
    "Qwen3ForCausalLM": "always",
    "DeepseekV2ForCausalLM": "if_first_is_1",
    "DeepseekV3ForCausalLM": "if_first_is_1",
    "KimiK25ForConditionalGeneration": "if_first_is_1",
}
# The target's fields a draft copies (SpecForge's generator copies the same; rope under either spelling).
TARGET_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
    "rms_norm_eps",
    "hidden_act",
    "initializer_range",
    "attention_bias",
    "attention_dropout",
    "head_dim",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


def served_capture(architecture: str, ids: Sequence[int]) -> list[int]:
    """The layers SGLang 0.5.23 captures at serving for a draft config naming ``ids``."""
    rule = _rule(architecture)
    if rule == "always" or (ids and ids[0] == 1):
        return [i + 1 for i in ids]
    return list(ids)


def serving_layer_ids(architecture: str, sglang_layers: Sequence[int]) -> list[int]:
    """The ``eagle_aux_hidden_state_layer_ids`` that make SGLang capture ``sglang_layers`` when it
    serves a drafter for ``architecture``; LayerConfigError where no ids can."""
    layers = list(sglang_layers)
    for ids in ([i - 1 for i in layers], layers):
        if min(ids, default=0) >= 0 and served_capture(architecture, ids) == layers:
            return ids
    raise LayerConfigError(
        f"aux layers {layers} (SGLang's convention: the input of decoder layer i) cannot be served: SGLang 0.5.23 "
        f"captures {architecture}'s aux states from the draft config's ids with +1 only when the first id is 1, so "
        f"no draft config makes it capture layer {layers[0]} first, and a drafter trained on this set would see "
        "other features when served. Capture from layer 2 or above in SGLang's convention (1 or above in the "
        "draft config's), e.g. the default [1, L//2-1, L-4]"
    )


def _rule(architecture: str) -> str:
    try:
        return PLUS_ONE_RULES[architecture]
    except KeyError:
        raise LayerConfigError(
            f"architecture {architecture!r}: how SGLang numbers its EAGLE-3 aux layers is not known to hsextract; "
            f"known: {', '.join(sorted(PLUS_ONE_RULES))}"
        ) from None


def text_config(model_config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config (Kimi-K2.5 keeps it under ``text_config``)."""
    inner = model_config.get("text_config")
    return inner if isinstance(inner, Mapping) else model_config


def build_draft_config(
    model_config: Mapping[str, Any], architecture: str, sglang_layers: Sequence[int], draft_vocab_size: int
) -> dict[str, Any]:
    """The draft config of a one-layer EAGLE-3 drafter for the set's target and capture layers."""
    text = text_config(model_config)
    config: dict[str, Any] = {k: text[k] for k in TARGET_FIELDS if k in text and text[k] is not None}
    missing = [k for k in ("vocab_size", "hidden_size", "num_attention_heads") if k not in config]
    if missing:
        raise LayerConfigError(f"the target's config has no {', '.join(missing)}: cannot describe a drafter for it")
    vocab = int(config["vocab_size"])
    config.update(
        architectures=[DRAFT_ARCHITECTURE],
        model_type="llama",
        num_hidden_layers=1,
        tie_word_embeddings=False,
        use_cache=True,
        draft_vocab_size=min(int(draft_vocab_size), vocab),
        eagle_config={
            "eagle_aux_hidden_state_layer_ids": serving_layer_ids(architecture, sglang_layers),
            "use_aux_hidden_state": True,
        },
    )
    return config


def lm_head_key(model_dir: Path) -> str:
    """The target's output-head weight in its checkpoint: ``lm_head.weight``, or the embedding's
    when the model ties them and stores none (SpecForge's default key then fails with a KeyError)."""
    index = model_dir / "model.safetensors.index.json"
    names: set[str] = set()
    if index.is_file():
        names = set(json.loads(index.read_text()).get("weight_map", {}))
    else:
        from safetensors import safe_open

        for f in sorted(model_dir.glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                names.update(st.keys())
    for key in ("lm_head.weight", "language_model.lm_head.weight"):
        if key in names:
            return key
    return next(
        (k for k in ("model.embed_tokens.weight", "language_model.model.embed_tokens.weight") if k in names),
        "lm_head.weight",
    )


def specforge_run(out: Path, model_dir: Path, draft_vocab_size: int, max_length: int) -> str:
    """A SpecForge 0.2.0 offline run of this set (``specforge train -c``): the paths, the head's key and
    the vocabulary mapping filled in; the training settings are a start to tune."""
    out, model_dir = Path(out).resolve(), Path(model_dir).resolve()
    mapping = out / "vocab_mapping" / f"vocab_mapping-{draft_vocab_size}.pt"
    lines = [
        "# SpecForge 0.2.0 offline EAGLE-3 training on this set (written by hsextract; edit the training settings).",
        *(
            []
            if list(model_dir.glob("*.index.json"))
            else [
                "# NOTE: SpecForge 0.2.0 reads the target's head through a *.index.json, "
                "which this model directory lacks",
                "# (a single-file checkpoint): point target_model_path at a copy with model.safetensors.index.json",
                '# ({"weight_map": {"<each tensor name>": "model.safetensors"}}), or SpecForge stops with',
                '# "No index.json file found".',
            ]
        ),
        "# specforge train -c specforge-train.yaml, then:",
        "# specforge export --to sglang --checkpoint <output_dir>/<run_id>-latest "
        f"--draft-config {out / DRAFT_CONFIG_FILE} --output-dir <draft dir> --vocab-mapping {mapping}",
        "model:",
        f"  target_model_path: {json.dumps(str(model_dir))}",
        f"  draft_model_config: {json.dumps(str(out / DRAFT_CONFIG_FILE))}",
        f"  vocab_mapping_path: {json.dumps(str(mapping))}",
        f"  lm_head_key: {lm_head_key(model_dir)}",
        "data:",
        f"  hidden_states_path: {json.dumps(str(out))}",
        f"  max_length: {max_length}",
        "training:",
        "  strategy: eagle3",
        "  num_epochs: 4",
        "  batch_size: 1",
        "  learning_rate: 1.0e-4",
        "  ttt_length: 7",
        "  seed: 0",
        f"output_dir: {json.dumps(str(out.parent / (out.name + '-drafter')))}",
        "run_id: eagle3",
    ]
    return "\n".join(lines) + "\n"


LENGTH_STEP = 1024


def max_length_for(entries: Sequence[ManifestEntry]) -> int:
    """SpecForge's ``data.max_length`` for the set: its longest sample, rounded up to a step
    (a shorter limit cuts the longest samples' ends out of training)."""
    longest = max((e.tokens for e in entries), default=1)
    return -(-longest // LENGTH_STEP) * LENGTH_STEP


def write_draft_files(
    out: Path,
    *,
    model_dir: str | Path,
    architecture: str,
    sglang_layers: Sequence[int],
    draft_vocab_size: int,
    fmt: str,
    max_length: int,
) -> list[Path]:
    """Write ``draft_config.json`` (and, for the SpecForge format, ``specforge-train.yaml``) into
    the set, each only when its bytes change; return what was written."""
    model_dir = Path(model_dir)
    model_config = json.loads((model_dir / "config.json").read_text())
    config = build_draft_config(model_config, architecture, sglang_layers, draft_vocab_size)
    files = {DRAFT_CONFIG_FILE: (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()}
    if fmt == "specforge":
        size = config["draft_vocab_size"]
        files[SPECFORGE_RUN_FILE] = specforge_run(out, model_dir, size, max_length).encode()
    written = []
    for name, data in files.items():
        path = Path(out) / name
        if not path.is_file() or path.read_bytes() != data:
            atomic_write_bytes(path, data)
            written.append(path)
    return written


def write_set_draft_files(
    out: Path, header: ManifestHeader, entries: Sequence[ManifestEntry], model_dir: str | Path, draft_vocab_size: int
) -> list[Path]:
    """`write_draft_files` for the set `out` of manifest `header` and `entries` (its layers, format and
    longest sample), from the model directory `model_dir`; ConfigError where it has no config.json."""
    model = Path(model_dir)
    if not (model / "config.json").is_file():
        raise ConfigError(f"{model}: no config.json; give the target model's directory with --model")
    return write_draft_files(
        out,
        model_dir=model,
        architecture=header.architecture,
        sglang_layers=header.sglang_layers_to_capture,
        draft_vocab_size=draft_vocab_size,
        fmt=header.format,
        max_length=max_length_for(entries),
    )
