"""One bench run from start to end: the models' servers started one model after the other, each
model's correctness runs and throughput rounds, the GPU's own unit tests beside them, and a few
samples against transformers once the servers are gone; ``result["ok"]`` only if all passed."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gpu_env

from .correctness import correctness
from .rows import compare_with_transformers
from .servers import Say, parallel_args, plan_models, start_servers, stop_servers, wait_servers
from .settings import FP8_CAPTURE_SIDES, GPU_DIR, PORT, REPO, SITE
from .throughput import throughput


def gpu_tests(env: gpu_env.GpuEnv, work: Path) -> dict:
    """The CUDA-only unit tests of the capture (the overwrite race, the shared buffers, the FP8 rows equal
    to the CPU's) on this GPU."""
    tests = [
        "tests/capture/test_owned_batch.py",
        "tests/capture/test_writer_process.py::"
        "test_on_cuda_the_shared_buffers_are_registered_and_the_rows_land_exactly",
        "tests/capture/test_fp8_capture.py::test_on_cuda_own_batch_with_fp8_gives_the_cpus_fp8_rows_scales_and_row_values",
    ]
    run_env = env.server_env((0,))
    run_env["PYTHONPATH"] += os.pathsep + str(REPO / "tests")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *tests],
        cwd=REPO,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    res: dict = {"ok": done.returncode == 0, "tail": "\n".join((done.stdout + done.stderr).splitlines()[-15:])}
    cost = subprocess.run(
        [sys.executable, str(GPU_DIR / "fingerprint_cost.py")],
        cwd=REPO,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        res["fingerprint_cost"] = json.loads(cost.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        res["fingerprint_cost"] = {"error": cost.stderr[-2000:]}
    return res


def run(args: argparse.Namespace, result: dict, say: Say, save: Callable[[], None], deadline: float) -> None:
    """Every step the arguments ask for, into ``result`` (saved after each); raises only on what
    ends the whole run (a model whose server does not start is recorded, and the next one runs)."""
    env = gpu_env.install(args.bundle, SITE, args.work / "install.log") if args.device == "cuda" else gpu_env.cpu_env()
    gpus = tuple(range(max(args.tp, args.dp_attention)))
    extra = parallel_args(args.tp, args.dp_attention)
    plans = plan_models(args.models.split(","), env, args.work, gpus[0], say)

    def start_model(k: int) -> None:
        # The throughput rounds run on the 8B-shaped model and, for the client's ceiling, the tiny one.
        rounds = args.rounds > 0 and plans[k].kind in args.throughput_models
        asked = args.sides.split(",") if args.sides else []
        plain = rounds and (not asked or "plain_loop" in asked)
        capture_fp8 = rounds and any(x in FP8_CAPTURE_SIDES for x in asked)
        # The no-overlap server only where something uses it: three 8B servers fill an H100's 80 GB.
        no_overlap = plans[k].kind in args.compare_no_overlap.split(",") or (
            rounds and (not asked or "loop_on_capture_no_overlap" in asked)
        )
        start_servers(
            plans[k],
            env,
            args.work,
            gpus,
            PORT + 10 * k,
            extra,
            plain=plain,
            no_overlap=no_overlap,
            capture_fp8=capture_fp8,
            fmt=args.throughput_format if rounds else "",
        )

    # One model's servers start together; the next model's once these are up, while these run: SGLang
    # sizes its KV cache from the memory that loading its weights took, which another model loading at
    # the same moment distorts (a tiny DeepSeek beside three 8B servers refused to start).
    start_model(0)
    checks = (
        ThreadPoolExecutor(max_workers=1).submit(gpu_tests, env, args.work)
        if args.device == "cuda" and not args.skip_gpu_tests
        else None
    )
    oks = []
    try:
        for k, plan in enumerate(plans):
            model_res = result["models"].setdefault(plan.kind, {"model": plan.path.name})
            try:
                wait_servers(plan, deadline)
            except Exception as exc:  # one model's server that cannot start does not take the other's run
                model_res["error"] = f"{type(exc).__name__}: {str(exc)[-3000:]}"
                say(f"{plan.kind}: a server did not start: {model_res['error'][-1500:]}")
                oks.append(False)
                stop_servers(plan)
                continue
            finally:
                if k + 1 < len(plans):
                    start_model(k + 1)
            say(f"{plan.kind}: servers healthy")
            if plan.kind in args.correctness_models:
                model_res["correctness"] = correctness(
                    plan,
                    env,
                    args.work,
                    args,
                    say,
                    lambda kind, res: (result["models"][kind].update(correctness=res), save()),
                    deadline - 60,
                )
                oks.append(model_res["correctness"]["ok"])
                save()
            if args.rounds > 0 and plan.kind in args.throughput_models:
                model_res["throughput"] = throughput(
                    plan,
                    env,
                    args.work,
                    args,
                    say,
                    lambda partial, m=model_res: (m.update(throughput=partial), save()),
                    deadline - 90,
                )
                ran = [case for case in model_res["throughput"]["cases"] if case["rounds"] > 0]
                # a bound the time left no round for is said (rounds 0), not counted as a failure
                oks += [bool(ran)] + [case["all_validated"] for case in ran]
                save()
    finally:
        for plan in plans:
            stop_servers(plan)
    if checks is not None:
        result["gpu_unit_tests"] = checks.result()
        oks.append(result["gpu_unit_tests"]["ok"])
        say(f"GPU unit tests: {result['gpu_unit_tests']}")
    for plan in plans:
        corr = result["models"][plan.kind].get("correctness")
        if corr is None:
            continue
        out = Path(corr.pop("_default_output", "") or "/nonexistent")
        # The 8B model in float32 takes a minute to load: only with the time for it.
        needed = 150 if plan.kind == "llama8b" and args.device == "cuda" else 30
        if args.transformers_samples and out.is_dir() and time.monotonic() < deadline - needed:
            corr["transformers"] = compare_with_transformers(
                out, plan.path, args.transformers_samples, 2048, args.device
            )
            say(f"{plan.kind} vs transformers: {corr['transformers']}")
            oks.append(corr["transformers"]["ok"])
        shutil.rmtree(out, ignore_errors=True)
        save()
    result["ok"] = bool(oks) and all(oks)
