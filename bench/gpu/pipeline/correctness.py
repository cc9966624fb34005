"""The correctness runs of one model: the real client and drain at each in-flight bound on the overlap
capture server, then at the default bound on the no-overlap server, whose rows the default run's
are compared with sample by sample. Every run's drain validates every sample."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import gpu_env

from .case import Case
from .dataset import write_dataset
from .processes import run_case
from .result import brief
from .rows import compare_runs
from .servers import ModelPlan, Say


def correctness(
    plan: ModelPlan,
    env: gpu_env.GpuEnv,
    work: Path,
    args: argparse.Namespace,
    say: Say,
    save: Callable[[str, dict], object],
    deadline: float,
) -> dict:
    """The model's correctness result; ``_default_output`` names the default bound's set, kept on
    disk for the comparison with transformers (the caller removes it)."""
    dataset = work / f"{plan.kind}-data.jsonl"
    samples = args.dsv3_samples if plan.kind == "dsv3" and args.dsv3_samples else args.samples
    made = write_dataset(dataset, samples, plan.context, plan.words, seed=args.seed)
    say(f"{plan.kind}: dataset {made}")
    res: dict = {"dataset": made, "runs": {}}
    save(plan.kind, res)
    outs = {}
    bounds = args.dsv3_in_flight if plan.kind == "dsv3" and args.dsv3_in_flight else args.in_flight
    default = Case(plan.path, dataset, work / f"{plan.kind}-overlap-{bounds[0]}", bounds[0], plan.context - 16)
    for n in bounds:
        if time.monotonic() > deadline:
            res["runs"][f"overlap-{n}"] = {"ok": False, "skipped": "out of time"}
            continue
        case = dataclasses.replace(default, out=work / f"{plan.kind}-overlap-{n}", in_flight=n)
        r = run_case(env, plan.servers["capture"], case)
        res["runs"][f"overlap-{n}"] = r
        save(plan.kind, res)
        say(f"{plan.kind} overlap, {n} in flight: {brief(r)}")
        if n == bounds[0]:
            outs[n] = case.out
        else:  # checked by the drain; the disk keeps only the default's set, for the row comparisons
            shutil.rmtree(case.out, ignore_errors=True)
    compare = plan.kind in args.compare_no_overlap.split(",")
    if compare:
        no_overlap = dataclasses.replace(default, out=work / f"{plan.kind}-no-overlap-{default.in_flight}")
        r = run_case(env, plan.servers["no_overlap"], no_overlap)
        res["runs"][f"no-overlap-{default.in_flight}"] = r
        say(f"{plan.kind} no overlap, {default.in_flight} in flight: {brief(r)}")
        if default.in_flight in outs and r["samples"]:
            res["overlap_vs_no_overlap"] = compare_runs(outs[default.in_flight], no_overlap.out)
            say(f"{plan.kind} rows, overlap vs no overlap: {res['overlap_vs_no_overlap']}")
        shutil.rmtree(no_overlap.out, ignore_errors=True)
    res["ok"] = all(r.get("ok") for r in res["runs"].values()) and (
        not compare or res.get("overlap_vs_no_overlap", {}).get("ok", False)
    )
    res["_default_output"] = str(outs.get(default.in_flight, ""))
    return res
