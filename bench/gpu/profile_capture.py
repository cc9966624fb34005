"""Where the scheduler's time goes with and without the capture: py-spy samples of the plain and the
capture server's scheduler process during one short-prompt round each (128-token prompts, 256 in
flight, where the capture costs most per token), with the GIL holder of every sample.

    python3 bench/gpu/profile_capture.py --bundle .gpu     # on the H200 machine; results in $OUT

Writes ``pyspy-<side>.txt`` (py-spy's raw format: one stack per line with its thread and count) and
``profile_capture.json``: per side, the round's tokens/s and the samples by thread (the scheduler's
main thread against the capture's ``hsx-*`` threads) — the share of the GIL the capture's threads
take from the scheduler.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import capture_server_gpu as bench  # noqa: E402
import gpu_env  # noqa: E402
from gpu_server import wait_healthy  # noqa: E402

SITE = Path("/tmp/hsx-gpu-site")


def scheduler_pid(server_pid: int) -> int:
    """The pid of the ``sglang::scheduler`` process in the server's process group."""
    pgid = os.getpgid(server_pid)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            if cmd.startswith("sglang::scheduler") and os.getpgid(int(entry.name)) == pgid:
                return int(entry.name)
        except (OSError, ProcessLookupError):
            continue
    raise RuntimeError(f"no sglang::scheduler process in the process group of {server_pid}")


def by_thread(raw: Path) -> dict[str, int]:
    """Samples per thread kind: the scheduler's main thread, the capture's threads, others."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        thread = stack.split(";", 1)[0]
        kind = "capture" if "hsx-" in thread else "main" if "MainThread" in thread else "other"
        counts[kind] += int(n)
    return dict(counts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=HERE.parents[1] / ".gpu")
    ap.add_argument("--work", type=Path, default=Path("/tmp/hsx-gpu-tier"))
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT") or args.work / "profile")
    out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    env = gpu_env.install(args.bundle, SITE, args.work / "install.log")
    model = bench.prepare_model(env, args.work, 0)
    servers = bench.start_pair(model, env, args.work, 0, 30300)
    case = bench.Case(128, 256, args.requests)
    result: dict[str, dict] = {}
    try:
        for handle in servers.values():
            wait_healthy(handle, 600)
        warm = bench.make_prompts(case, 512, seed=1)
        for side, handle in servers.items():
            bench.run_round(handle, case, warm, side == "capture")
        prompts = bench.make_prompts(case, args.requests, seed=2)
        for side, handle in servers.items():
            raw = out / f"pyspy-{side}.txt"
            pid = scheduler_pid(handle.proc.pid)
            cmd = [
                str(SITE / "bin" / "py-spy"),
                "record",
                "--pid",
                str(pid),
                "--gil",
                "--threads",
                "--nonblocking",
                "--rate",
                str(args.rate),
                "--format",
                "raw",
                "--output",
                str(raw),
            ]
            spy = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            time.sleep(1.0)  # py-spy attached
            res = bench.run_round(handle, case, prompts, side == "capture")
            spy.send_signal(2)
            log = spy.communicate(timeout=60)[0]
            result[side] = {
                "round": res,
                "gil_samples_by_thread": by_thread(raw) if raw.is_file() else {},
                "py_spy_log": log[-1500:],
            }
            print(side, json.dumps(result[side])[:800], flush=True)
    finally:
        for handle in servers.values():
            handle.stop()
    (out / "profile_capture.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
