"""Check one staged dump against the model: is it the sample the server really computed?

Used by the Ansible smoke test after a 10-token probe request (``max_new_tokens: 1``,
``temperature: 0``) and by the tests. Besides the form of the dump (shapes, dtype, finite values,
the token ids the client sent), it checks the *content* end to end: the captured final hidden
state of the last prompt position, put through the model's own ``lm_head`` (after the final
RMSNorm when the dump stores it pre-norm), must give the token the server returned; and, given
the server's URL, the final states of the prompt's positions must give the logprobs the server
itself returns for the probe (asked once, without a rid, so it is not captured). Only the two
weights needed are read from the model's safetensors files, by name, so the check runs on a
CPU in seconds even for a 1T-parameter model.

The token check and its bf16 tolerance are `hsextract.greedy_check`'s, the logprob check and its
bound `hsextract.logprob_check`'s; the drain runs both on a share of real samples too. A dump the
capture staged in FP8 (its ``precision: fp8``) is checked on its rows dequantized as the trainer
will read them (`hsextract.fp8.dequantize`), with the greedy check's FP8 tolerance.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from hsextract import fp8, server_logprobs
from hsextract.errors import ConfigError, StagingError
from hsextract.greedy_check import BF16_REL_TIE, FP8_REL_TIE, GreedyHead
from hsextract.logprob_check import check_final_rows
from hsextract.server_logprobs import LogprobsUnavailable
from hsextract.staging.dumps import DTYPES, read_done_marker, read_states, rid_dir


@dataclass
class SelfCheckResult:
    ok: bool
    rid: str
    reasons: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def check_dump(
    dump_dir: str | Path,
    rid: str,
    model_path: str | Path,
    expected_input_ids: list[int] | None,
    server_token: int | None,
    server_url: str | None = None,
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
    hidden, ids = _rows_read(res, marker, states)
    res.details.update(
        prompt_len=marker.prompt_len,
        shape=list(hidden.shape),
        dtype=marker.dtype,
        precision=marker.precision,
        final_hidden=marker.final_hidden,
        sglang_layers_to_capture=marker.sglang_layers_to_capture,
        eagle_aux_hidden_state_layer_ids=marker.eagle_aux_hidden_state_layer_ids,
    )
    _check_form(res, marker, hidden, ids, expected_input_ids)
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
        fp8 = states.scales is not None
        _check_token(res, hidden, marker.final_hidden, model_path, int(server_token), server_url, ids.tolist(), fp8)
    res.ok = not res.reasons
    return res


def _check_form(res: SelfCheckResult, marker, hidden: torch.Tensor, ids: torch.Tensor, expected_input_ids) -> None:
    """The dump's form: the shape and dtype done.json promises, finite values, the request's token ids."""
    expected_shape = [marker.prompt_len, marker.num_aux + 1, marker.hidden_size]
    if list(hidden.shape) != expected_shape:
        res.reasons.append(f"hidden shape {list(hidden.shape)} != {expected_shape} promised by done.json")
    if marker.dtype not in DTYPES or hidden.dtype != DTYPES[marker.dtype][0]:
        res.reasons.append(f"hidden dtype {hidden.dtype} does not match done.json's {marker.dtype}")
    if not bool(torch.isfinite(hidden).all()):
        bad = int((~torch.isfinite(hidden)).sum())
        res.reasons.append(f"{bad} non-finite values (NaN/inf) in the hidden states")
    if expected_input_ids is not None and ids.tolist() != list(expected_input_ids):
        first = next(
            (i for i, (a, b) in enumerate(zip(ids.tolist(), expected_input_ids, strict=False)) if a != b),
            min(len(ids), len(expected_input_ids)),
        )
        res.reasons.append(
            f"token ids differ from the request's at position {first} "
            f"(dump has {len(ids)} ids, request had {len(expected_input_ids)})"
        )


def _rows_read(res: SelfCheckResult, marker, states):  # -> tuple[torch.Tensor, torch.Tensor]
    """(the rows as a trainer reads them, the ids): an FP8-staged dump's dequantized (its scales checked
    first), else the staged rows; a marker that says other than the file holds is a reason."""
    if (states.scales is not None) != (marker.precision == "fp8"):
        res.reasons.append(f"done.json says {marker.precision} rows, the file holds {states.hidden.dtype}")
    if states.scales is None:
        return states.hidden, states.input_ids
    problem = fp8.scales_problem(states.scales, states.hidden.shape[0])
    if problem is not None:
        res.reasons.append(f"FP8 scales: {problem}")
    dtype = DTYPES[marker.dtype][0] if marker.dtype in DTYPES else torch.bfloat16
    return fp8.dequantize(states.hidden, states.scales, dtype), states.input_ids


def _check_token(
    res: SelfCheckResult,
    hidden: torch.Tensor,
    final_hidden: str,
    model_path: Path,
    server_token: int,
    server_url: str | None,
    input_ids: list[int],
    fp8: bool = False,
) -> None:
    try:
        server = server_logprobs.fetch(server_url, input_ids) if server_url else None
        head = GreedyHead(model_path)
        tie, bound = FP8_REL_TIE if fp8 else BF16_REL_TIE, server_logprobs.bound_for(fp8)
        verdict, logprobs = check_final_rows(
            head, hidden[:, -1], final_hidden, server_token, server, tie=tie, bound=bound
        )
    except (ConfigError, LogprobsUnavailable) as exc:
        res.reasons.append(
            f"the server's logprobs of the probe: {exc}" if isinstance(exc, LogprobsUnavailable) else str(exc)
        )
        return
    res.details.update(
        predicted_token=verdict.predicted,
        server_token=server_token,
        logit_gap=verdict.logit_gap,
        tie_tolerance=verdict.tolerance,
    )
    if verdict.near_tie:
        res.details["near_tie"] = True
    if not verdict.ok:
        res.reasons.append(verdict.explain())
    if logprobs is not None:
        res.details["logprobs"] = logprobs.numbers()
        if not logprobs.ok:
            res.reasons.append(logprobs.explain())
