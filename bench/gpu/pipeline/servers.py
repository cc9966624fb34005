"""Each model's servers: its directory (generated here), the flags it runs with, and the overlap
capture, no-overlap capture and plain servers started, awaited and stopped together."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import gpu_env
from gpu_server import ServerHandle, ServerSpec, capture_flags, start, wait_healthy

from .settings import ALL_SIDES

Say = Callable[[str], None]


@dataclass
class ModelPlan:
    """One model's servers and dataset shape."""

    kind: str
    path: Path
    context: int
    words: str  # "w" for the word tokenizer of the 8B model (w<id>), else English words
    chunk: int
    server_args: tuple[str, ...]
    servers: dict[str, ServerHandle] = field(default_factory=dict)
    sides: tuple[str, ...] = (*ALL_SIDES[:4], "pipeline_drain_first")  # the throughput rounds' sides
    samples: int = 0  # the throughput dataset's size (0: --samples)
    mean_words: int = 120
    long_prompts: bool = True


def parallel_args(tp: int, dp_attention: int) -> tuple[str, ...]:
    """The servers' flags for ``--tp`` and ``--dp-attention`` (none at 1)."""
    args: list[str] = []
    if tp > 1:
        args += ["--tp", str(tp), "--disable-custom-all-reduce"]
    if dp_attention > 1:
        args += ["--enable-dp-attention", "--dp", str(dp_attention)]
    return tuple(args)


def plan_models(kinds: list[str], env: gpu_env.GpuEnv, work: Path, gpu: int, say: Say) -> list[ModelPlan]:
    """Each model's directory (generated here) and the server flags it runs with."""
    from hsextract.tiny_model import ensure_tiny_model

    plans = []
    tiny_llama = ensure_tiny_model("llama", work / "models" / "llama")
    for kind in kinds:
        if kind == "llama8b" and env.cuda:
            import capture_server_gpu

            t0 = time.monotonic()
            path = capture_server_gpu.prepare_model(env, work, gpu)
            say(f"8B-shaped model ready in {time.monotonic() - t0:.0f} s")
            plans.append(
                ModelPlan(
                    kind,
                    path,
                    32768,
                    "w",
                    8192,
                    capture_flags(0.9),
                )
            )
        elif kind == "llama8b":  # the dry run: the tiny Llama in its place
            plans.append(
                ModelPlan(
                    kind,
                    tiny_llama,
                    2048,
                    "en",
                    64,
                    ("--chunked-prefill-size", "64", "--max-total-tokens", "8192", "--max-running-requests", "32"),
                )
            )
        elif kind == "tiny":  # the client's ceiling: short prompts, a server that answers at once
            plans.append(
                ModelPlan(
                    kind,
                    tiny_llama,
                    2048,
                    "en",
                    2048,
                    ("--max-total-tokens", "262144", "--max-running-requests", "512", "--mem-fraction-static", "0.1")
                    if env.cuda
                    else ("--max-total-tokens", "8192", "--max-running-requests", "64"),
                    sides=(
                        "plain_loop",
                        "loop_on_capture",
                        "pipeline",
                        "pipeline_2_processes",
                        "client_alone",
                        "pipeline_drain_first",
                    ),
                    samples=6000 if env.cuda else 300,
                    mean_words=12,
                    long_prompts=False,
                )
            )
        else:
            path = ensure_tiny_model("dsv3-gpu" if env.cuda else "dsv3", work / "models" / "dsv3")
            gpu_args = ("--disable-cuda-graph",) if env.cuda else ()
            plans.append(
                ModelPlan(
                    kind,
                    path,
                    2048,
                    "en",
                    128,
                    (
                        "--chunked-prefill-size",
                        "128",
                        "--max-total-tokens",
                        "16384",
                        "--max-running-requests",
                        "64",
                        "--mem-fraction-static",
                        "0.1",
                        *gpu_args,
                    )
                    if env.cuda
                    else ("--chunked-prefill-size", "64", "--max-total-tokens", "8192", "--max-running-requests", "32"),
                )
            )
    return plans


def start_servers(
    plan: ModelPlan,
    env: gpu_env.GpuEnv,
    work: Path,
    gpus: tuple[int, ...],
    port: int,
    extra: tuple[str, ...],
    plain: bool,
    no_overlap: bool = True,
    capture_fp8: bool = False,
    fmt: str = "",
) -> None:
    """Overlap capture, no-overlap capture (where ``no_overlap``), (for the throughput rounds) plain,
    and (where ``capture_fp8``) a capture server staging FP8 rows, of ``plan``; the capture servers place
    the final hidden state as ``fmt`` needs (the throughput rounds' format)."""
    if not env.cuda:  # the CPU engine has no overlap scheduler to switch off: two capture servers alike
        extra = ()
    args = (*plan.server_args, *extra)
    specs = {"capture": ServerSpec(f"{plan.kind}-capture", plan.path, port, gpus, True, args, format=fmt)}
    if no_overlap:
        specs["no_overlap"] = ServerSpec(
            f"{plan.kind}-capture-no-overlap",
            plan.path,
            port + 1,
            gpus,
            True,
            (*args, "--disable-overlap-schedule"),
            format=fmt,
        )
    if capture_fp8:
        specs["capture_fp8"] = ServerSpec(
            f"{plan.kind}-capture-fp8", plan.path, port + 3, gpus, True, args, precision="fp8", format=fmt
        )
    if plain:
        specs["plain"] = ServerSpec(f"{plan.kind}-plain", plan.path, port + 2, gpus, False, (*plan.server_args, *extra))
    plan.servers = {name: start(spec, env, work) for name, spec in specs.items()}


def wait_servers(plan: ModelPlan, deadline: float) -> None:
    """Until each of the model's servers answers, a minute at least each (`ServerStartError` else)."""
    for handle in plan.servers.values():
        wait_healthy(handle, max(60.0, deadline - time.monotonic()))


def stop_servers(plan: ModelPlan) -> None:
    """The model's servers stopped together, their GPU memory free for the next model's."""
    with ThreadPoolExecutor() as pool:
        list(pool.map(lambda h: h.stop(), plan.servers.values()))
    plan.servers = {}
