"""What the drain and its forkserver do before the drain's first sample: their imports, and what
their processes hold (for bench/drain_start.py --imports).

`import_timeline` runs a fresh interpreter with ``-X importtime`` over the modules one of the two
processes imports before the first sample (the drain: the CLI, the drain's command and its core;
the forkserver: its preload), and reads its report: the total, the modules that cost most by
their own time, and the packages that cost most with everything they import. The same interpreter
then says whether anything of it touched CUDA: torch's CUDA state initialized, the driver
(``libcuda.so``) loaded, and how many threads the imports left running (a BLAS or OpenMP pool sized
for the host's cores shows here). `process_probe` says the same of the running drain's processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

# The imports of each process before the drain's first sample (the drain: `python -m hsextract
# drain`, its command's run, then hsextract.drain.core; the forkserver: its preload).
PROCESSES = {
    "drain": ["hsextract.cli", "hsextract.drain.command", "hsextract.drain.core"],
    "forkserver": ["hsextract.drain.forkserver_preload"],
}
_PROBE = """
import json, os, sys
maps = open("/proc/self/maps").read()
torch = sys.modules.get("torch")
print(json.dumps({
    "libcuda_loaded": "libcuda.so" in maps,
    "cuda_initialized": bool(torch is not None and torch.cuda.is_initialized()),
    "threads": int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("Threads:"))),
    "modules": len(sys.modules),
    "loaded": sorted(m for m in ("triton", "sglang", "transformers", "datasets", "pyarrow", "boto3", "sympy",
                                 "torch._dynamo", "torch._inductor", "scipy", "pandas") if m in sys.modules),
}))
"""
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)")


def import_timeline(tree: Path, modules: list[str], top: int = 12) -> dict:
    """The import report of a fresh interpreter importing `modules` from `tree`'s package."""
    code = "".join(f"import {m}\n" for m in modules) + _PROBE
    env = dict(os.environ, PYTHONPATH=str(tree / "files" / "python"))
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"importing {modules} failed:\n{done.stderr[-3000:]}")
    rows = []  # (own seconds, with its imports, depth, name)
    for line in done.stderr.splitlines():
        m = _LINE.match(line)
        if m:
            rows.append((int(m[1]) / 1e6, int(m[2]) / 1e6, len(m[3]) // 2, m[4]))
    by_self = sorted(rows, reverse=True)[:top]
    # Each top-level package where it is first imported, with what it imports (hsextract's own
    # modules apart: they contain the others).
    packages = sorted((r for r in rows if "." not in r[3] and r[3] != "hsextract"), key=lambda r: r[1], reverse=True)
    ours = sum(own for own, _, _, name in rows if name.startswith("hsextract"))
    return {
        "modules": modules,
        "interpreter_wall_s": round(wall, 3),
        "imports_s": round(sum(r[1] for r in rows if r[2] == 0), 3),
        "top_by_own_time": [{"module": n, "s": round(s, 3)} for s, _, _, n in by_self],
        "top_with_imports": [{"module": n, "s": round(c, 3)} for _, c, _, n in packages[:top]],
        "hsextract_own_s": round(ours, 3),
        "after_imports": json.loads(done.stdout.strip().splitlines()[-1]),
    }


def process_probe(pid: int) -> list[dict]:
    """The drain's process and its descendants now: each one's threads and whether it has loaded the
    CUDA driver (a process gone meanwhile is left out)."""
    import psutil

    found = []
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return found
    for p in procs:
        try:
            maps = Path(f"/proc/{p.pid}/maps").read_text()
            found.append(
                {
                    "pid": p.pid,
                    "role": "drain" if p.pid == pid else _role(p, pid),
                    "threads": p.num_threads(),
                    "libcuda_loaded": "libcuda.so" in maps,
                }
            )
        except (psutil.NoSuchProcess, OSError):
            continue
    return found


def _role(p, drain: int) -> str:
    """The drain's forkserver, the resource tracker (its children both), or a worker (the forkserver's)."""
    line = " ".join(p.cmdline())
    if p.ppid() != drain:
        return "worker"
    return "forkserver" if "forkserver" in line else "resource tracker" if "resource_tracker" in line else "other"


def print_timeline(name: str, t: dict) -> None:
    after = t["after_imports"]
    print(
        f"{name}: imports {t['imports_s']:.2f} s (interpreter start to exit {t['interpreter_wall_s']:.2f} s); "
        f"CUDA driver loaded: {after['libcuda_loaded']}, CUDA initialized: {after['cuda_initialized']}, "
        f"threads after the imports: {after['threads']}, of note: {', '.join(after['loaded']) or 'none'}",
        flush=True,
    )
    print(
        "  packages, with their imports: "
        + ", ".join(f"{r['module']} {r['s']:.2f}" for r in t["top_with_imports"])
        + f"; hsextract's own modules {t['hsextract_own_s']:.2f}"
    )
    print("  modules, own time: " + ", ".join(f"{r['module']} {r['s']:.3f}" for r in t["top_by_own_time"]))
