"""The JSON result and the lines printed from it: the result document, one in-flight bound's rounds
summed up as the figures docs/ and the tests read (their keys are the format of bench/results/),
and the brief line printed after each run."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from .settings import ALL_SIDES, FORMAT


def new_result(device: str, tp: int, dp_attention: int, in_flight: list[int], samples: int) -> dict:
    """The result document before any model ran (``pipeline_gpu.json``)."""
    return {
        "benchmark": "pipeline_gpu",
        "device": device,
        "tp": tp,
        "dp_attention": dp_attention,
        "in_flight": in_flight,
        "samples": samples,
        "format": FORMAT,
        "models": {},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_result(result: dict, dirs: tuple[Path | None, ...]) -> None:
    """``pipeline_gpu.json`` into each of ``dirs`` that is set, whole, as it stands now."""
    for d in dirs:
        if d:
            (d / "pipeline_gpu.json").write_text(json.dumps(result, indent=2) + "\n")


def case_result(
    in_flight: int,
    rows: dict[str, list[dict]],
    ceiling_gb_per_s: float | None = None,
    *,
    output_root: str = "",
    reaped: bool = False,
    bytes_per_token: float = 0,
) -> dict:
    """One in-flight bound's rounds, summed up; with the disk's ceiling, the keys every pipeline figure
    carries (bench/common.on_disk_keys): the whole pipeline (the drain up first where it ran, as the
    units run it) over min(the plain loop, the ceiling's tokens/s)."""
    from common import on_disk_keys, pipeline_over_ceiling

    out = _case_figures(in_flight, rows)
    whole = out["drain_first_whole_tokens_per_s"] or out["whole_pipeline_tokens_per_s"]
    plain = out["plain_loop_tokens_per_s"]
    drains = [
        x["drain_gb_per_s"]
        for side in ("pipeline", "pipeline_drain_first")
        for x in rows.get(side, [])
        if x.get("drain_gb_per_s")
    ]
    over = (
        pipeline_over_ceiling(whole["median"], plain["median"], ceiling_gb_per_s, bytes_per_token)
        if whole and plain and ceiling_gb_per_s and bytes_per_token
        else None
    )
    return {
        **out,
        **on_disk_keys(
            output_root,
            ceiling_gb_per_s,
            statistics.median(drains) if drains else None,
            reaped=reaped,
            whole_over_ceiling=over,
        ),
    }


def _case_figures(in_flight: int, rows: dict[str, list[dict]]) -> dict:
    pipeline = rows.get("pipeline", [])
    plain = [x["tokens_per_s"] for x in rows.get("plain_loop", [])]
    on_capture = [x["tokens_per_s"] for x in rows.get("loop_on_capture", [])]
    no_overlap = [x["tokens_per_s"] for x in rows.get("loop_on_capture_no_overlap", [])]
    client = [x["client_tokens_per_s"] for x in rows.get("pipeline", []) if x.get("client_tokens_per_s")]
    whole = [x["pipeline_tokens_per_s"] for x in rows.get("pipeline", []) if x.get("pipeline_tokens_per_s")]
    plain_sps = [x["samples"] / x["wall_s"] for x in rows.get("plain_loop", [])]
    client_sps = [x["client_samples_per_s"] for x in rows.get("pipeline", []) if x.get("client_samples_per_s")]
    first = rows.get("pipeline_drain_first", [])
    first_whole = [x["pipeline_tokens_per_s"] for x in first if x.get("pipeline_tokens_per_s")]
    first_sps = [x["samples"] / x["pipeline_wall_s"] for x in first if x.get("pipeline_wall_s")]
    two_sps = [x["client_samples_per_s"] for x in rows.get("pipeline_2_processes", []) if x.get("client_samples_per_s")]
    alone_sps = [x["client_samples_per_s"] for x in rows.get("client_alone", []) if x.get("client_samples_per_s")]
    drain_sps = [
        x["drain_alone_samples_per_s"] for x in rows.get("client_alone", []) if x.get("drain_alone_samples_per_s")
    ]
    after_startup = [
        x["tokens"] / (x["pipeline_wall_s"] - x["client_startup_s"])
        for x in rows.get("pipeline", [])
        if x.get("client_startup_s") and x.get("tokens")
    ]
    med = statistics.median

    def spread(v: list[float]) -> dict:
        return {"median": med(v), "min": min(v), "max": max(v)} if v else {}

    return {
        "in_flight": in_flight,
        "rounds": max((len(v) for v in rows.values()), default=0),  # the sides run the same rounds
        "plain_loop_tokens_per_s": spread(plain),
        "client_phase_tokens_per_s": spread(client),
        "whole_pipeline_tokens_per_s": spread(whole),
        "loop_on_capture_tokens_per_s": spread(on_capture),
        "loop_on_capture_no_overlap_tokens_per_s": spread(no_overlap),
        "capture_server_over_plain": round(med(on_capture) / med(plain), 4) if on_capture and plain else None,
        "no_overlap_over_overlap": round(med(no_overlap) / med(on_capture), 4) if no_overlap and on_capture else None,
        "client_phase_over_plain": round(med(client) / med(plain), 4) if client and plain else None,
        "whole_pipeline_over_plain": round(med(whole) / med(plain), 4) if whole and plain else None,
        "plain_loop_samples_per_s": spread([round(v, 1) for v in plain_sps]),
        "client_phase_samples_per_s": spread(client_sps),
        "client_samples_over_plain": round(med(client_sps) / med(plain_sps), 4) if client_sps and plain_sps else None,
        "two_processes_samples_per_s": spread(two_sps),
        "two_processes_over_plain": round(med(two_sps) / med(plain_sps), 4) if two_sps and plain_sps else None,
        "client_alone_samples_per_s": spread(alone_sps),
        "client_alone_over_plain": round(med(alone_sps) / med(plain_sps), 4) if alone_sps and plain_sps else None,
        "drain_alone_samples_per_s": spread(drain_sps),
        # the drain up before the client, as the units run them: from the client's start to the drain's exit
        "drain_first_whole_tokens_per_s": spread(first_whole),
        "drain_first_whole_over_plain": round(med(first_whole) / med(plain), 4) if first_whole and plain else None,
        "drain_first_whole_samples_per_s": spread([round(v, 1) for v in first_sps]),
        "drain_first_tail_s": spread([x["tail_s"] for x in first if "tail_s" in x]),
        "drain_up_before_client_s": spread(
            [x["drain_up_before_client_s"] for x in first if x.get("drain_up_before_client_s")]
        ),
        # from the first request to the drain's exit: the pipeline's pace once started (these runs are
        # short, so the start-up is a large share of their wall time)
        "whole_after_startup_tokens_per_s": spread([round(v, 1) for v in after_startup]),
        "whole_after_startup_over_plain": round(med(after_startup) / med(plain), 4)
        if after_startup and plain
        else None,
        "client_startup_s": spread([x["client_startup_s"] for x in pipeline if x.get("client_startup_s")]),
        "drain_gb_per_s_spread": spread([x["drain_gb_per_s"] for x in pipeline if x.get("drain_gb_per_s")]),
        **_fp8_figures(rows),
        "all_validated": all(x["ok"] for side in ALL_SIDES[1:] for x in rows.get(side, [])),
        "per_round": rows,
    }


def _fp8_figures(rows: dict[str, list[dict]]) -> dict:
    """The FP8 sides beside their bf16 twin (all with the drain up first, the same format): for rows
    quantized by the drain (``fp8_``) and by the capture on the GPU (``fp8_capture_``), the whole
    pipeline's tokens/s over the bf16 side's, the set's bytes per token (the files as written, scales
    and headers included) and the drain's GB/s; and the FP8 capture server's own pace over the bf16
    capture server's and the plain server's. Empty where no FP8 side ran."""
    med = statistics.median
    bf16 = [x for x in rows.get("pipeline_drain_first", []) if x.get("pipeline_tokens_per_s")]
    bf16_whole = med(x["pipeline_tokens_per_s"] for x in bf16) if bf16 else None
    bf16_per_token = _per_token(bf16)
    out: dict = {}
    for side, key in (("pipeline_drain_first_fp8", "fp8"), ("pipeline_drain_first_fp8_capture", "fp8_capture")):
        fp8 = [x for x in rows.get(side, []) if x.get("pipeline_tokens_per_s")]
        if not fp8:
            continue
        whole = [x["pipeline_tokens_per_s"] for x in fp8]
        per_token = _per_token(fp8)
        out["bf16_bytes_per_token"] = bf16_per_token
        out |= {
            f"{key}_whole_tokens_per_s": {"median": med(whole), "min": min(whole), "max": max(whole)},
            f"{key}_whole_over_bf16": round(med(whole) / bf16_whole, 4) if bf16_whole else None,
            f"{key}_bytes_per_token": per_token,
            f"{key}_bytes_over_bf16": round(per_token / bf16_per_token, 4) if per_token and bf16_per_token else None,
            f"{key}_drain_gb_per_s": med([x["drain_gb_per_s"] for x in fp8 if x.get("drain_gb_per_s")] or [0]),
            f"{key}_tail_s": med([x["tail_s"] for x in fp8 if "tail_s" in x] or [0]),
        }
    loops = {side: [x["tokens_per_s"] for x in rows.get(side, [])] for side in (*ALL_SIDES[:2], "loop_on_capture_fp8")}
    if loops["loop_on_capture_fp8"]:
        fp8_loop = med(loops["loop_on_capture_fp8"])
        out["loop_on_capture_fp8_tokens_per_s"] = fp8_loop
        for base, key in (("loop_on_capture", "capture_fp8_over_capture"), ("plain_loop", "capture_fp8_over_plain")):
            out[key] = round(fp8_loop / med(loops[base]), 4) if loops[base] else None
    return out


def _per_token(side: list[dict]) -> float | None:
    """The median bytes per token of the sets of a side's rounds (None: no round counted its tokens)."""
    per = [x["gb"] * 1e9 / x["tokens"] for x in side if x.get("tokens")]
    return round(statistics.median(per), 1) if per else None


def brief(r: dict) -> str:
    """One run's outcome in a line: what passed, how much, how fast, what the self-check found."""
    keys = (
        "ok",
        "samples",
        "tokens",
        "client_tokens_per_s",
        "pipeline_tokens_per_s",
        "tokens_per_s",
        "client_startup_s",
        "quarantined_by_reason",
        "selfchecked",
        "selfcheck",
        "accounts",
    )
    return json.dumps({k: r[k] for k in keys if k in r})
