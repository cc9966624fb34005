"""Start SGLang 0.5.23 servers of the GPU test tier, with the capture on or off, on chosen GPUs.

A capture server gets the project's capture patch rendered by `hsextract.capture.patch` and the
flags of `server_launch` (the ones the Ansible server unit carries); a plain server gets the same
flags without the patch, so a comparison of the two measures the capture alone. Servers start
without waiting (several start at once and share the machine's start-up time); `wait_healthy`
then waits for each. Each runs in its own process group, so `ServerHandle.stop` ends all of it.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpu_env import REPO, GpuEnv

sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "tests")]

from hsextract.capture.config import WRITER_PROCESS_DEFAULT, CaptureConfig  # noqa: E402
from hsextract.capture.patch import DEFAULT_PACKAGE, render_patch, server_launch  # noqa: E402
from hsextract.formats import final_hidden_for  # noqa: E402
from hsextract.model_info import read_model_info  # noqa: E402
from support.sglang_server import ServerHandle, ServerStartError, log_tail, wait_healthy  # noqa: E402

__all__ = ["ServerHandle", "ServerSpec", "ServerStartError", "dump_dir_for", "log_tail", "start", "wait_healthy"]

STAGING_ROOT = Path("/dev/shm") / "hsx-gpu-tier"


def capture_flags(mem_fraction: float) -> tuple[str, ...]:
    """A capture server's batch and memory flags on one GPU: prefill in chunks of 8,192 tokens, a KV
    pool capped at 131,072 tokens (16 GiB at 8B), up to 256 requests at once, `mem_fraction` of the
    memory SGLang finds free at its start, and decode graphs up to batch 8 (a capture's replies are
    one token)."""
    return (
        "--chunked-prefill-size",
        "8192",
        "--max-total-tokens",
        "131072",
        "--max-running-requests",
        "256",
        "--mem-fraction-static",
        str(mem_fraction),
        "--cuda-graph-max-bs-decode",
        "8",
    )


def dump_dir_for(name: str) -> Path:
    """The staging directory of the server named ``name``."""
    return STAGING_ROOT / name


@dataclass(frozen=True)
class ServerSpec:
    """One server: model, GPUs, capture on/off and the flags that differ between servers."""

    name: str
    model: Path
    port: int
    gpus: tuple[int, ...] = (0,)
    capture: bool = True
    args: tuple[str, ...] = ()  # parallelism, memory, graph and batch flags
    rid_prefix: str = "hsx"
    # "capture": the capture's flags (radix cache off, prefill graphs off), with or without the patch;
    # "generation": regeneration's (radix cache on, CUDA graphs as SGLang sets them, no patch), as the
    # server unit's generation profile (roles/sglang_server).
    profile: str = "capture"
    writer_threads: int = 0  # the capture's writer threads (0: its default)
    # The capture writes from a child process (hsextract.capture.writer_process); False: from threads.
    writer_process: bool = WRITER_PROCESS_DEFAULT
    precision: str = "bf16"  # how the capture stages the rows ("fp8": quantized on the GPU, hsextract.fp8)
    format: str = ""  # the set's format, which places the final hidden state ("": the capture's default)


def render_capture_patch(spec: ServerSpec, out: Path) -> Path:
    """The capture patch of ``spec``'s server, rendered under ``out`` (for its PYTHONPATH)."""
    capture = CaptureConfig(
        architecture=read_model_info(spec.model).architecture,
        model_path=str(spec.model),
        dump_dir=str(dump_dir_for(spec.name)),
        rid_prefix=spec.rid_prefix,
        writer_threads=spec.writer_threads,
        writer_process=spec.writer_process,
        precision=spec.precision,
        format=spec.format,
        final_hidden=final_hidden_for(spec.format) if spec.format else "post_norm",
    )
    return render_patch(out, capture)


def start(spec: ServerSpec, env: GpuEnv, work: Path) -> ServerHandle:
    """Launch ``spec`` (log and patch under ``work/<name>``, dumps under /dev/shm/hsx-gpu-tier/<name>);
    return at once, before the server is healthy."""
    base = Path(work) / spec.name
    base.mkdir(parents=True, exist_ok=True)
    dump_dir = dump_dir_for(spec.name)
    if spec.profile not in ("capture", "generation") or (spec.profile == "generation" and spec.capture):
        raise ValueError(
            f"{spec.name}: profile {spec.profile!r} with capture={spec.capture}: the capture runs only "
            "in the capture profile"
        )
    patch_dir = render_capture_patch(spec, base / "patch") if spec.capture else None
    # The capture's server flags for both kinds of server, so that they differ only by the patch.
    launch = server_launch(patch_dir or base, package_name=DEFAULT_PACKAGE, device=env.device)
    if spec.profile == "generation":
        launch_args = [a for a in launch.args if a not in ("--disable-radix-cache", "--disable-prefill-cuda-graph")]
    else:
        launch_args = list(launch.args)
    run_env = env.server_env(spec.gpus, (patch_dir,) if patch_dir else ())
    if patch_dir:
        run_env.update({k: v for k, v in launch.env.items() if k != "PYTHONPATH"})
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(spec.model),
        "--host",
        "127.0.0.1",
        "--port",
        str(spec.port),
        "--log-level",
        "info",
        *env.device_args(),
        *launch_args,
        *spec.args,
    ]
    log_path = base / "server.log"
    with open(log_path, "wb") as log:
        log.write((" ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=run_env, cwd=str(base), start_new_session=True
        )
    return ServerHandle(
        f"http://127.0.0.1:{spec.port}",
        spec.port,
        dump_dir,
        Path(spec.model),
        spec.rid_prefix,
        proc,
        log_path,
        patch_dir,
    )


def capture_log_lines(log_path: Path) -> list[str]:
    """The capture's own lines of a server log (its start line per rank, warnings and errors)."""
    text = Path(log_path).read_text(errors="replace")
    return [line for line in text.splitlines() if "hsextract capture" in line or "capture:" in line]
