"""The capture writer's cost per request beside a Python-bound scheduler, on CPU, side by side in one
run: no capture, this tree's writer, optionally this tree's writer in a child process
(``--writer-process``: the ``capture-process`` side) and the writer of an earlier revision.

The short-prompt stress of the GPU bench (hundreds of requests a second) is where the writer's
per-request Python work shows: its threads share the server's interpreter with SGLang's scheduler.
Here a stand-in scheduler thread does a fixed amount of pure-Python work per batch, hands the batch
to the writer (`CaptureWriter.submit`, as the SGLang hook does: many short requests per batch),
then sleeps as if the GPU ran the forward. Each round runs in a fresh process (so another
revision's package can be loaded), and rounds alternate between the sides. Reported per side:

* the stand-in's Python work time (median): what the writer's threads take from the scheduler;
* the process's CPU time per request beyond the no-capture side (user and system; on the
  ``capture-process`` side with the writer process's own time during the round, read from /proc).

    python3 bench/capture_writer_cpu.py [--writer-process] [--compare-with REV] [--rounds 7]

A dump-removing process stands in for the drain, so /dev/shm does not fill.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from common import machine_info  # noqa: E402


def py_work(n: int) -> dict:
    """The stand-in scheduler's Python work for one batch (dict and str churn, like its bookkeeping)."""
    d: dict = {}
    for i in range(n):
        d[i & 255] = (i, str(i & 15))
    return d


def one_round(side: str, dump_root: str, a: argparse.Namespace) -> dict:
    """One round in this process: ``a.batches`` batches of ``a.per_batch`` requests, with or without capture."""
    import torch
    from hsextract.capture.core import BatchRequest, CaptureSettings
    from hsextract.capture.sink import WriterOptions
    from hsextract.capture.writer import CaptureWriter
    from hsextract.layers import resolve

    h, t, b = a.hidden, a.tokens, a.per_batch
    rows = t * b
    settings = CaptureSettings(rid_prefix="hsx", layers=resolve(None, 32, "eagle"), hidden_size=h)
    aux = torch.randn(rows, 3 * h).to(torch.bfloat16)
    final = torch.randn(rows, h).to(torch.bfloat16)
    ids = torch.randint(0, 1000, (rows,))
    writer = child = None
    if side == "capture-process":
        from hsextract.capture.writer_process import ProcessCaptureWriter

        writer = ProcessCaptureWriter(dump_root, settings, WriterOptions(num_threads=8), device="cpu")
        writer.flush()  # the child has started (its start is not the round's)
        child = writer.child_pid
    elif side != "plain":
        writer = CaptureWriter(dump_root, settings, WriterOptions(num_threads=8), device="cpu")
    child0 = _cpu_of(child)
    cpu0, work, n = os.times(), 0.0, 0
    start = time.perf_counter()
    for _ in range(a.batches):
        w0 = time.perf_counter()
        py_work(a.work)
        work += time.perf_counter() - w0
        if writer:
            reqs = []
            for i in range(b):
                n += 1
                reqs.append(BatchRequest(f"hsx-{os.getpid():x}-{n}", i * t, 0, t, i))
            writer.submit(reqs, aux, final, ids, [t] * b)
        time.sleep(a.gpu_ms / 1000)
    done = 0
    if writer:
        writer.flush()
        done = writer.requests_done
    cpu1, child1 = os.times(), _cpu_of(child)
    if writer:
        writer.close()
    return {
        "work_s": work,
        "wall_s": time.perf_counter() - start,
        "user_s": cpu1.user - cpu0.user + child1[0] - child0[0],
        "sys_s": cpu1.system - cpu0.system + child1[1] - child0[1],
        "requests_done": done,
        "requests": a.batches * b if writer else 0,
    }


def _cpu_of(pid: int | None) -> tuple[float, float]:
    """(user, system) seconds of process ``pid`` so far; zeros without one."""
    if pid is None:
        return 0.0, 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def package_of(rev: str, into: Path) -> Path:
    """files/python of revision ``rev``, extracted under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "files/python"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "files" / "python"


def run_side(side: str, package: Path, dump_root: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(package), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        __file__,
        "--_round",
        side,
        "--_dump",
        str(dump_root),
        "--hidden",
        str(args.hidden),
        "--tokens",
        str(args.tokens),
        "--per-batch",
        str(args.per_batch),
        "--batches",
        str(args.batches),
        "--work",
        str(args.work),
        "--gpu-ms",
        str(args.gpu_ms),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"round of {side} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare-with", metavar="REV", help="also measure the writer of this git revision")
    ap.add_argument(
        "--writer-process",
        action="store_true",
        help="also measure this tree's writer in a child process (writer_process)",
    )
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=128, help="prompt tokens per request")
    ap.add_argument("--per-batch", type=int, default=64, help="requests per batch")
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--work", type=int, default=20000, help="stand-in scheduler iterations per batch")
    ap.add_argument("--gpu-ms", type=float, default=20, help="the stand-in forward's time per batch")
    ap.add_argument("--json", type=Path, help="also write the result here")
    ap.add_argument("--_round", help=argparse.SUPPRESS)
    ap.add_argument("--_dump", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._round:
        print(json.dumps(one_round(args._round, args._dump, args)))
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="hsx-writer-bench-"))
    dump_root = Path(tempfile.mkdtemp(prefix="hsx-writer-bench-", dir="/dev/shm"))
    sides = {"plain": REPO / "files" / "python", "capture": REPO / "files" / "python"}
    if args.writer_process:
        sides["capture-process"] = REPO / "files" / "python"
    if args.compare_with:
        sides[f"capture@{args.compare_with}"] = package_of(args.compare_with, tmp)
    drain = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import os, shutil, sys, time\nr = sys.argv[1]\nwhile True:\n"
                "    for n in os.listdir(r):\n"
                "        if os.path.exists(os.path.join(r, n, 'done.json')):\n"
                "            shutil.rmtree(os.path.join(r, n), ignore_errors=True)\n"
                "    time.sleep(0.01)\n"
            ),
            str(dump_root),
        ]
    )
    rounds: dict[str, list[dict]] = {s: [] for s in sides}
    try:
        names = list(sides)
        for r in range(args.rounds + 1):  # round 0 warms the page cache and is not counted
            for side in names if r % 2 == 0 else names[::-1]:
                res = run_side(side, sides[side], dump_root, args)
                if r:
                    rounds[side].append(res)
    finally:
        drain.kill()
        shutil.rmtree(dump_root, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    plain_work = statistics.median(x["work_s"] for x in rounds["plain"])
    plain_user = statistics.median(x["user_s"] for x in rounds["plain"])
    plain_sys = statistics.median(x["sys_s"] for x in rounds["plain"])
    result: dict = {
        "benchmark": "capture_writer_cpu",
        "rounds": args.rounds,
        "hidden": args.hidden,
        "tokens_per_request": args.tokens,
        "requests_per_batch": args.per_batch,
        "sides": {},
    }
    for side, rows in rounds.items():
        n = rows[0]["requests"]
        if n and any(x["requests_done"] != n for x in rows):
            raise SystemExit(f"{side}: a round staged fewer requests than it submitted: {rows}")
        work = statistics.median(x["work_s"] for x in rows)
        result["sides"][side] = {
            "scheduler_work_s": round(work, 4),
            "scheduler_speed_vs_plain": round(plain_work / work, 3),
            "cpu_us_per_request": None
            if not n
            else {
                "user": round((statistics.median(x["user_s"] for x in rows) - plain_user) / n * 1e6),
                "system": round((statistics.median(x["sys_s"] for x in rows) - plain_sys) / n * 1e6),
            },
        }
        print(
            f"{side:24s} scheduler work {work:.3f} s ({plain_work / work:.3f} of plain)"
            + (f", CPU per request: {result['sides'][side]['cpu_us_per_request']} us" if n else "")
        )
    result["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["machine"] = machine_info()
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
