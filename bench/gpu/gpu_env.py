"""Where and how the GPU test tier runs SGLang: the installed bundle and each server's environment.

On the H200 test machine (Python 3.12, torch 2.11, triton 3.6, transformers 5.17, no network) the
bundle built by ``bench/gpu/build_bundle.py`` is installed once per machine: its wheels into a
site directory with ``pip --target`` and the CuTe-DSL shim over SGLang's module. A server then runs
``python3 -m sglang.launch_server`` with, on PYTHONPATH, the ``sgl_kernel`` stand-in first (and the
SGLang plugin beside it), the site directory, and the project's package, plus the settings below.

The same code drives a dry run on a CPU machine (``device="cpu"``): the test suite's environment
already has SGLang, the CPU ``sgl_kernel`` stub of the tests comes before the stand-in (whose
SGLang plugin still loads), and servers run SGLang's CPU engine. That checks the tier's scripts
end to end before GPU time is spent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIR = REPO / "files" / "python"
CPU_STUB_DIR = REPO / "tests" / "stubs"

# NVLink multicast stays off on the lent multi-GPU machines (it can take a shared host's GPUs out
# of service); every process the tier starts inherits these.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# SGLang on a GPU without its real kernel wheel, flashinfer or cutlass-dsl:
GPU_SETTINGS = {
    # the stand-in is not an installed sglang-kernel distribution
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
    # every fused op (RMSNorm, SiluAndMul, rotary, MoE, ...) takes its pure-torch path
    "SGLANG_FORCE_FUSED_OP_BACKEND": "torch",
    # the Python radix-tree core, not the bundled Rust one (linked against another torch)
    "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
    # several test servers share the GPUs, so their free memory differs
    "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "0",
    "SGLANG_JIT_CACHE_DIR": "/tmp/hsx-gpu-cache/sgl-jit",
    "TVM_FFI_CACHE_DIR": "/tmp/hsx-gpu-cache/tvm-ffi",
}
COMMON_SETTINGS = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
    **NO_MULTICAST,
}

SHIM_TARGET = Path("sglang") / "kernels" / "ops" / "gemm" / "cutedsl_dual_gemm.py"


class GpuEnvError(RuntimeError):
    """The bundle cannot be installed or SGLang does not import from it; the message says why."""


@dataclass
class GpuEnv:
    """What a server of the tier needs: device, paths on PYTHONPATH and environment settings."""

    device: str  # "cuda" or "cpu"
    pythonpath: list[Path] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def server_env(self, gpus: tuple[int, ...] = (), extra_path: tuple[Path, ...] = ()) -> dict[str, str]:
        """The environment of one server process (and its children) pinned to ``gpus``."""
        env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_EXTERNAL_MODEL_PACKAGE", "PYTHONPATH")}
        env.update(self.settings)
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (*self.pythonpath, *extra_path))
        if self.cuda and gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        return env

    def device_args(self) -> list[str]:
        """Server flags for the GPU (on the CPU, `server_launch` gives them): Triton attention and
        the pytorch sampler, which need no flashinfer."""
        if self.cuda:
            return ["--device", "cuda", "--attention-backend", "triton", "--sampling-backend", "pytorch"]
        return []


def install(bundle: Path, site: Path, log_path: Path) -> GpuEnv:
    """Install the bundle's wheels into ``site`` (once: a marker records it), apply the shim, and
    check that SGLang's server module imports with the stand-in; return the environment."""
    bundle, site = Path(bundle).resolve(), Path(site)
    wheels = sorted((bundle / "whl").glob("*.whl"))
    standin = bundle / "standin"
    if not wheels or not (standin / "sgl_kernel" / "utils.py").is_file():
        raise GpuEnvError(
            f"{bundle} is not a built bundle (no whl/*.whl or standin/sgl_kernel/utils.py); "
            "build it with python3 bench/gpu/build_bundle.py"
        )
    marker = site / ".hsextract-bundle"
    stamp = "\n".join(w.name for w in wheels)
    if not marker.is_file() or marker.read_text() != stamp:
        shutil.rmtree(site, ignore_errors=True)
        with open(log_path, "ab") as log:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-index",
                    "--no-deps",
                    "--no-compile",
                    "--no-cache-dir",
                    "--target",
                    str(site),
                    *map(str, wheels),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        if done.returncode != 0:
            raise GpuEnvError(f"pip install of the bundle's {len(wheels)} wheels failed; see {log_path}")
        shutil.copy(bundle / "shims" / "cutedsl_dual_gemm.py", site / SHIM_TARGET)
        marker.write_text(stamp)
    env = GpuEnv("cuda", [standin, site, PACKAGE_DIR], {**COMMON_SETTINGS, **GPU_SETTINGS})
    check_imports(env, log_path)
    return env


def cpu_env() -> GpuEnv:
    """The dry-run environment: this interpreter's SGLang on the CPU, with the tests' stub."""
    return GpuEnv(
        "cpu",
        [CPU_STUB_DIR, REPO / "bench" / "gpu" / "standin", PACKAGE_DIR],
        {**COMMON_SETTINGS, "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"},
    )


def check_imports(env: GpuEnv, log_path: Path) -> None:
    """SGLang's server module and the stand-in import in a server's environment, or GpuEnvError."""
    probe = (
        "import sgl_kernel, sglang, sglang.launch_server; "
        "print('sglang', sglang.__version__, 'sgl_kernel', sgl_kernel.__version__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env.server_env(), capture_output=True, text=True, timeout=300
    )
    with open(log_path, "a") as log:
        log.write(done.stdout + done.stderr)
    if done.returncode != 0:
        raise GpuEnvError(f"sglang.launch_server does not import in the tier's environment:\n{done.stderr[-3000:]}")
