"""Check one staged dump against the model: is it the sample the server really computed?

Used by the Ansible smoke test after a 10-token probe request (``max_new_tokens: 1``,
``temperature: 0``) and by the tests. Besides the form of the dump (shapes, dtype, finite values,
the token ids the client sent), it checks the *content* end to end: the captured final hidden
state of the last prompt position, put through the model's own ``lm_head`` (after the final
RMSNorm when the dump stores it pre-norm), must give the token the server returned. Only the two
weights needed are read from the model's safetensors files, by name, so the check runs on a
CPU in seconds even for a 1T-parameter model.

Tolerance (bf16 ties): the server's logits come from a bf16 matmul, ours from float32 over the
bf16-rounded hidden state. The check passes when our argmax is the server's token, or when the
server's token is within ``2**-7 * max(1, |top logit|)`` (one bf16 ulp, relative) of our top
logit; such a near-tie pass is reported in the details.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from hsextract.errors import StagingError
from hsextract.staging import DTYPES, read_done_marker, read_states, rid_dir

BF16_REL_TIE = 2.0**-7


@dataclass
class SelfCheckResult:
    ok: bool
    rid: str
    reasons: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def _weight_files(model_path: Path) -> list[Path]:
    index = model_path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_path / n for n in names]
    return sorted(model_path.glob("*.safetensors"))


def load_named_tensors(model_path: str | Path, wanted: dict[str, list[str]]) -> dict[str, torch.Tensor]:
    """For each key of `wanted`, the first of its candidate tensor names found in the model's files."""
    from safetensors import safe_open

    model_path = Path(model_path)
    index = model_path / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"] if index.is_file() else None
    found: dict[str, torch.Tensor] = {}
    files = _weight_files(model_path)
    for key, candidates in wanted.items():
        for name in candidates:
            paths = files if weight_map is None else [model_path / weight_map[n] for n in [name] if n in weight_map]
            for p in paths:
                with safe_open(str(p), framework="pt") as f:
                    if name in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
                        found[key] = f.get_tensor(name)
                        break
            if key in found:
                break
    return found


def _head_names(config: dict[str, Any]) -> dict[str, list[str]]:
    prefixes = ["", "language_model.", "model.language_model."]
    head = [f"{p}lm_head.weight" for p in prefixes]
    if config.get("tie_word_embeddings") or (config.get("text_config") or {}).get("tie_word_embeddings"):
        head += [f"{p}model.embed_tokens.weight" for p in prefixes]
    norm = [f"{p}model.norm.weight" for p in prefixes]
    return {"lm_head": head, "norm": norm}


def rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = h.float()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def check_dump(
    dump_dir: str | Path,
    rid: str,
    model_path: str | Path,
    expected_input_ids: list[int] | None,
    server_token: int | None,
) -> SelfCheckResult:
    """Verify the dump of `rid`; never raises for a bad dump (the reasons say what is wrong)."""
    res = SelfCheckResult(ok=False, rid=rid)
    d = rid_dir(dump_dir, rid)
    try:
        marker = read_done_marker(d)
    except StagingError as exc:
        res.reasons.append(f"no usable done marker: {exc}")
        return res
    try:
        states = read_states(d)
    except StagingError as exc:
        res.reasons.append(f"states unreadable: {exc}")
        return res
    hidden, ids = states.hidden, states.input_ids
    res.details.update(prompt_len=marker.prompt_len, shape=list(hidden.shape), dtype=marker.dtype,
                       final_hidden=marker.final_hidden, sglang_layers_to_capture=marker.sglang_layers_to_capture,
                       eagle_aux_hidden_state_layer_ids=marker.eagle_aux_hidden_state_layer_ids)
    expected_shape = [marker.prompt_len, marker.num_aux + 1, marker.hidden_size]
    if list(hidden.shape) != expected_shape:
        res.reasons.append(f"hidden shape {list(hidden.shape)} != {expected_shape} promised by done.json")
    if marker.dtype not in DTYPES or hidden.dtype != DTYPES[marker.dtype][0]:
        res.reasons.append(f"hidden dtype {hidden.dtype} does not match done.json's {marker.dtype}")
    if not bool(torch.isfinite(hidden).all()):
        bad = int((~torch.isfinite(hidden)).sum())
        res.reasons.append(f"{bad} non-finite values (NaN/inf) in the hidden states")
    if expected_input_ids is not None and ids.tolist() != list(expected_input_ids):
        first = next((i for i, (a, b) in enumerate(zip(ids.tolist(), expected_input_ids, strict=False)) if a != b),
                     min(len(ids), len(expected_input_ids)))
        res.reasons.append(f"token ids differ from the request's at position {first} "
                           f"(dump has {len(ids)} ids, request had {len(expected_input_ids)})")
    model_path = Path(model_path)
    try:
        config = json.loads((model_path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        res.reasons.append(f"cannot read {model_path / 'config.json'}: {exc}")
        return res
    text_cfg = config.get("text_config") or config
    if int(text_cfg.get("hidden_size", marker.hidden_size)) != marker.hidden_size:
        res.reasons.append(f"dump hidden size {marker.hidden_size} != model's {text_cfg.get('hidden_size')}")
    if server_token is not None and not res.reasons:
        _check_token(res, hidden, marker.final_hidden, model_path, config, text_cfg, int(server_token))
    res.ok = not res.reasons
    return res


def _check_token(res: SelfCheckResult, hidden: torch.Tensor, final_hidden: str, model_path: Path,
                 config: dict[str, Any], text_cfg: dict[str, Any], server_token: int) -> None:
    weights = load_named_tensors(model_path, _head_names(config))
    if "lm_head" not in weights:
        res.reasons.append(f"no lm_head weight found in {model_path}")
        return
    h = hidden[-1, -1].float()
    if final_hidden == "pre_norm":
        if "norm" not in weights:
            res.reasons.append(f"dump is pre-norm but no final norm weight found in {model_path}")
            return
        h = rms_norm(h, weights["norm"], float(text_cfg.get("rms_norm_eps", 1e-6)))
    logits = weights["lm_head"].float() @ h
    top = int(logits.argmax())
    gap = float(logits[top] - logits[server_token]) if 0 <= server_token < logits.numel() else float("inf")
    tol = BF16_REL_TIE * max(1.0, abs(float(logits[top])))
    res.details.update(predicted_token=top, server_token=server_token, logit_gap=gap, tie_tolerance=tol)
    if top == server_token:
        return
    if gap <= tol:
        res.details["near_tie"] = True
        return
    res.reasons.append(
        f"the captured final hidden state of the last position predicts token {top}, but the server returned "
        f"{server_token} (logit gap {gap:.4g} > tolerance {tol:.4g}): the dump does not hold the states the "
        "server computed (wrong layer, norm placement or rows)")
