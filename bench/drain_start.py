"""The drain's start: seconds from starting `hsextract drain` (as the unit runs it) to its first
sample in the training set, with small samples already staged, its workers in processes.

While the drain starts, the capture keeps staging and a client stopped by `--max-staged` waits:
on the H200 host the drain with 8 worker processes wrote nothing for its first 9-11 s
(bench/results/pipeline_gpu_drain_start.json). With `--other-tree`, the same drain from another
checkout (the code before a change, say) runs in alternating rounds, and the last line is the
median ratio of the two trees' seconds, round by round.

Each round also reads the drain's own log lines, each timed from the drain's process start: ready
(its "draining" line), its first sample taken, its worker processes started. `--imports` first
prints, for each tree, the import timeline of the drain's process and of its forkserver, each in a
fresh interpreter (bench/start_timeline.py: the total, the costliest modules, and whether anything
loaded the CUDA driver or left threads running), and each round says what the drain's processes
hold at its first sample (threads, the CUDA driver).

    python bench/drain_start.py [--rounds 3] [--workers 8] [--imports]
        [--other-tree PATH [--other-label TEXT]] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "files" / "python"))
sys.path.insert(0, str(REPO / "bench"))

import drain_throughput as dt  # noqa: E402
from hsextract.output.manifest import entries_path  # noqa: E402
from start_timeline import PROCESSES, import_timeline, print_timeline, process_probe  # noqa: E402


@dataclass
class Round:
    """One drain's start, each time from its start: the first manifest line, the drain's exit, and its
    own log lines (None where it did not say, or finished before its worker processes were up)."""

    first_sample_s: float
    drained_s: float
    workers_up_s: float | None
    ready_s: float | None  # its "draining" line
    first_taken_s: float | None  # its "first sample taken" line
    processes: list[dict]  # at the first sample (bench/start_timeline.process_probe)


def first_sample_s(tree: Path, master: Path, base: Path, workers: int, timeout: float = 300) -> Round:
    """One drain over a fresh copy of the staged dumps in `master`, run from `tree`'s package."""
    work = base / "run"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(master / "dump", work / "dump")
    shutil.copytree(master / "run", work / "out")
    (work / "out" / ".hsextract").mkdir(parents=True, exist_ok=True)
    shutil.copy(master / "client-summary.json", work / "out" / ".hsextract" / "client-summary.json")
    env = dict(os.environ, PYTHONPATH=str(tree / "files" / "python"), OMP_NUM_THREADS="1")
    manifest = entries_path(work / "out")
    args = ["--dump-dir", str(work / "dump"), "--output", str(work / "out"), "--format", "specforge"]
    args += ["--worker-mode", "processes", "--workers", str(workers), "--exit-when-done", "--poll-interval", "0.05"]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hsextract", "drain", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[tuple[float, str]] = []  # the drain's log lines, each with when it came
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), ln) for ln in proc.stderr), daemon=True)
    reader.start()
    first, processes = None, []
    while first is None and proc.poll() is None and time.monotonic() - t0 < timeout:
        if manifest.exists() and manifest.stat().st_size > 0:
            first = time.monotonic() - t0
            processes = process_probe(proc.pid)
        else:
            time.sleep(0.01)
    proc.wait(timeout=timeout)
    reader.join(timeout=10)
    whole = time.monotonic() - t0
    err = "".join(ln for _, ln in lines)
    if proc.returncode != 0 or first is None:
        raise SystemExit(f"the drain from {tree} exited {proc.returncode}:\n{err[-3000:]}")
    # The drain's line "N worker processes started in X s", timed here from the drain's start.
    up = [t - t0 for t, ln in lines if re.search(r"\d+ worker processes started in", ln)]
    return Round(
        first, whole, round(up[0], 2) if up else None, _age(err, "ready"), _age(err, "first sample taken"), processes
    )


def _age(log: str, what: str) -> float | None:
    """The drain's own "<what> ..., N s after the drain's start" (hsextract.process_age), or None."""
    m = re.search(re.escape(what) + r".*?([\d.]+) s after the drain's start", log)
    return float(m[1]) if m else None


def _commit_of(tree: Path) -> str:
    """The tree's commit (what the results name: never a path of the machine that ran them)."""
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def _say(r: int, name: str, one: Round, samples: int, processes: bool) -> None:
    up = "after the last sample" if one.workers_up_s is None else f"in {one.workers_up_s:.1f} s"
    own = f"ready {_s(one.ready_s)}, first sample taken {_s(one.first_taken_s)}"
    print(
        f"round {r} {name:5s}: first sample {one.first_sample_s:6.2f} s ({own}), {samples} samples drained in "
        f"{one.drained_s:6.2f} s, worker processes up {up}",
        flush=True,
    )
    if processes:
        print(
            "  at the first sample: "
            + ", ".join(
                f"{p['role']} {p['threads']} threads{' CUDA DRIVER' if p['libcuda_loaded'] else ''}"
                for p in one.processes
            )
        )


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--samples-mb", type=float, default=20, help="staged megabytes of tiny-model samples")
    ap.add_argument("--other-tree", type=Path, help="another checkout, run in alternating rounds")
    ap.add_argument("--other-label", help="what the results call the other tree (default: its commit)")
    ap.add_argument(
        "--imports",
        action="store_true",
        help="print the import timeline of the drain and of its forkserver, and what their processes hold",
    )
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "drain_start.json")
    args = ap.parse_args()

    dt.HIDDEN, dt.TOKENS = 64, (100, 330)
    trees = {"this": REPO, **({"other": args.other_tree.resolve()} if args.other_tree else {})}
    imports = {}
    if args.imports:
        for name, tree in trees.items():
            imports[name] = {proc: import_timeline(tree, modules) for proc, modules in PROCESSES.items()}
            for proc, timeline in imports[name].items():
                print_timeline(f"{name} {proc}", timeline)
    shm = Path(tempfile.mkdtemp(prefix="hsx-start-", dir="/dev/shm"))
    try:
        master = shm / "master"
        samples, _ = dt.stage_master(master, int(args.samples_mb * 1e6))
        for marker in (master / "dump").glob("*/done.json"):  # SpecForge takes the final hidden state post-norm
            marker.write_text(marker.read_text().replace('"pre_norm"', '"post_norm"'))
        rows: dict[str, list[Round]] = {name: [] for name in trees}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for name in order:
                one = first_sample_s(trees[name], master, shm, args.workers)
                rows[name].append(one)
                _say(r, name, one, samples, args.imports)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    med = statistics.median
    result = {
        "benchmark": "drain_start",
        "workers": args.workers,
        "worker_mode": "processes",
        "samples": samples,
        "cores": os.cpu_count(),
        "trees": {k: (args.other_label if k == "other" else None) or _commit_of(v) for k, v in trees.items()},
        "first_sample_s": {k: [round(o.first_sample_s, 2) for o in v] for k, v in rows.items()},
        "drained_s": {k: [round(o.drained_s, 2) for o in v] for k, v in rows.items()},
        # From the drain's start to its line "N worker processes started" (None: it had finished before).
        "workers_up_s": {k: [o.workers_up_s for o in v] for k, v in rows.items()},
        # The drain's own lines, from its process's start: ready ("draining"), its first sample taken.
        "ready_s": {k: [o.ready_s for o in v] for k, v in rows.items()},
        "first_taken_s": {k: [o.first_taken_s for o in v] for k, v in rows.items()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if args.imports:
        result["imports"] = imports
        result["processes_at_first_sample"] = {k: [o.processes for o in v] for k, v in rows.items()}
    if "other" in rows:
        pairs = list(zip(rows["this"], rows["other"], strict=True))
        for key in ("first_sample", "drained", "workers_up"):
            both = [(getattr(t, f"{key}_s"), getattr(o, f"{key}_s")) for t, o in pairs]
            ratios = [b / a for a, b in both if a and b]
            if ratios:  # (workers_up: rounds where both drains had their processes up)
                result[f"{key}_other_over_this"] = {
                    "median": round(med(ratios), 2),
                    "min": round(min(ratios), 2),
                    "max": round(max(ratios), 2),
                }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    for name, v in rows.items():
        print(f"{name}: first sample {med([o.first_sample_s for o in v]):.2f} s (median of {len(v)})")
    for key in ("first_sample", "drained", "workers_up"):
        if f"{key}_other_over_this" in result:
            print(f"{key.replace('_', ' ')}, other tree over this one: {result[f'{key}_other_over_this']['median']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
