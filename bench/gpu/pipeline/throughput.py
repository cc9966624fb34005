"""The throughput rounds of one model: at each in-flight bound, rounds in a rotating order of the
plain loop on the plain server, the plain loop on the overlap and the no-overlap capture servers
(what the capture and the overlap scheduler cost at the server), and the whole product on the
overlap capture server, beside the disk's own speed and ceiling measured in the same call."""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import gpu_env

from .case import Case
from .dataset import encode, write_dataset
from .loop import run_loop_on_capture, run_plain_loop
from .machine import ceiling_sizes, disk_ceiling, disk_speed, sample_bytes_per_token, tokenizer_load
from .processes import run_case
from .result import brief, case_result
from .servers import ModelPlan, Say
from .settings import ALL_SIDES, FP8_CAPTURE_SIDES


@dataclass(frozen=True)
class Rounds:
    """One in-flight bound's rounds: the case its product sides run (``case.out`` the prefix of each
    round's set, ``<out>-<round>-<side>``), and each side's results."""

    case: Case
    rows: dict[str, list[dict]] = field(default_factory=dict)


def throughput(
    plan: ModelPlan,
    env: gpu_env.GpuEnv,
    work: Path,
    args: argparse.Namespace,
    say: Say,
    save: Callable[[dict], object],
    deadline: float,
) -> dict:
    """The model's throughput result: the dataset, the disk, the tokenizer's phase and a summed-up
    case per in-flight bound (`result.case_result`)."""
    dataset = work / f"{plan.kind}-data.jsonl"
    res: dict = {"cases": []}
    if plan.samples or not dataset.exists():
        dataset = work / f"{plan.kind}-throughput-data.jsonl"
        res["dataset"] = write_dataset(
            dataset,
            plan.samples or args.samples,
            plan.context,
            plan.words,
            seed=args.seed,
            mean_words=plan.mean_words,
            long_prompts=plan.long_prompts,
        )
    max_tokens = plan.context - 16
    prompts = encode(dataset, plan.path, max_tokens)
    res["output_root"] = str(args.output_root)
    res["format"] = args.throughput_format
    res["disk"] = disk_speed(args.output_root / "dd")
    per_token = sample_bytes_per_token(plan.path)
    sizes = ceiling_sizes(prompts, per_token)
    # The disk's ceiling in the same call, before the rounds and after them (the better is the ceiling).
    res["disk_ceiling"] = [disk_ceiling(args.output_root / "ceiling", sizes)]
    say(f"{plan.kind}: disk ceiling {res['disk_ceiling'][0]['disk_ceiling_gb_per_s']} GB/s")
    on_disk = {"output_root": str(args.output_root), "reaped": bool(args.reap_output), "bytes_per_token": per_token}
    res["tokenizer_load"] = tokenizer_load(env, plan.path)
    say(f"{plan.kind}: the client's tokenizer phase, apart: {res['tokenizer_load']}")
    say(f"{plan.kind}: disk {res['disk']}")
    sides = _sides(args.sides, plan.sides)

    def cases(bounds: list[Rounds]) -> list[dict]:
        return [case_result(b.case.in_flight, b.rows, _ceiling(res), **on_disk) for b in bounds]

    done: list[Rounds] = []
    for n in args.throughput_in_flight:
        out = args.output_root / f"{plan.kind}-bench-{n}"
        case = Case(plan.path, dataset, out, n, max_tokens, format=args.throughput_format)
        bound = Rounds(case, {side: [] for side in sides})
        for r in range(args.rounds):
            if time.monotonic() > deadline:
                break
            k = r % len(sides)
            for side in sides[k:] + sides[:k]:
                bound.rows[side].append(run_side(plan, env, args, bound.case, side, r, prompts))
                say(f"{plan.kind} round {r} {side} {n} in flight: {brief(bound.rows[side][-1])}")
            save({**res, "cases": cases([*done, bound])})
        done.append(bound)
    res["disk_ceiling"].append(disk_ceiling(args.output_root / "ceiling", sizes))
    res["cases"] = cases(done)
    return res


def run_side(
    plan: ModelPlan,
    env: gpu_env.GpuEnv,
    args: argparse.Namespace,
    case: Case,
    side: str,
    r: int,
    prompts: list[list[int]],
) -> dict:
    """Round ``r`` of one side at ``case``'s bound: a plain loop, or the product with its set under
    ``--output-root`` (removed after the round; py-spy where asked)."""
    n = case.in_flight
    if side == "plain_loop":
        return run_plain_loop(plan.servers["plain"].url, prompts, n)
    if side == "loop_on_capture":
        return run_loop_on_capture(plan.servers["capture"], prompts, n)
    if side == "loop_on_capture_no_overlap":
        return run_loop_on_capture(plan.servers["no_overlap"], prompts, n)
    if side == "loop_on_capture_fp8":
        return run_loop_on_capture(plan.servers["capture_fp8"], prompts, n)
    profile = args.profile_client / f"pyspy-{plan.kind}-{side}-{n}-{r}.txt" if args.profile_client else None
    drain_profile = (
        args.profile_drain / f"pyspy-drain-{plan.kind}-{side}-{n}-{r}.txt" if args.profile_drain and r == 0 else None
    )
    run = case.for_side(
        side,
        case.out.with_name(f"{case.out.name}-{r}-{side}"),
        profile=profile,
        profile_drain=drain_profile,
        reap=args.reap_output,
    )
    server = plan.servers["capture_fp8" if side in FP8_CAPTURE_SIDES else "capture"]
    res = run_case(env, server, run)
    shutil.rmtree(run.out, ignore_errors=True)
    return res


def _sides(asked: str, own: tuple[str, ...]) -> tuple[str, ...]:
    """The rounds' sides: those ``--sides`` names, in its order (any of ALL_SIDES: the FP8 side runs
    only where asked), else the model's own."""
    if not asked:
        return own
    names = tuple(x for x in asked.split(",") if x)
    unknown = [x for x in names if x not in ALL_SIDES]
    if unknown:
        raise ValueError(f"unknown sides {unknown}; the sides are {ALL_SIDES}")
    return names


def _ceiling(res: dict) -> float:
    return max(c["disk_ceiling_gb_per_s"] for c in res["disk_ceiling"])
