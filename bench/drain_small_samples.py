"""The drain's samples per second on many small samples: workers as threads against workers as
processes, side by side in alternating rounds.

Small samples (a tiny model's rows, 100-330 tokens) cost the drain its Python per sample, not its
disk, so the output goes to a tmpfs and what is measured is the drain's own ceiling: how many
samples a second it reads, checks, encodes, writes durably and commits, with the draft vocabulary
counted and the run's end-of-run check passing (every staged sample in the set). Each drain runs
on a fresh copy of the same staged dumps into an empty output directory.

    python bench/drain_small_samples.py [--gb 0.2] [--rounds 3] [--workers N] [--json PATH]

The last line is the median of processes over threads, same round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "files" / "python"))
sys.path.insert(0, str(REPO / "bench"))

import drain_throughput as dt  # noqa: E402
from hsextract.drain.config import DEFAULT_WORKERS  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=0.2, help="staged bytes (hidden 64: about 9,000 samples a GB)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    ap.add_argument("--format", default="specforge", help="the output format (default: the project's, specforge)")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "drain_small_samples.json")
    args = ap.parse_args()

    dt.HIDDEN, dt.TOKENS = 64, (100, 330)
    shm = Path(tempfile.mkdtemp(prefix="hsx-small-", dir="/dev/shm"))
    try:
        master = shm / "master"
        samples, nbytes = dt.stage_master(master, int(args.gb * 1e9))
        rates: dict[str, list[float]] = {"threads": [], "processes": []}
        for r in range(args.rounds):
            for mode in ("threads", "processes") if r % 2 == 0 else ("processes", "threads"):
                _, wall, _, _ = dt.one_drain(args.format, master, shm, shm, args.workers, True, worker_mode=mode)
                rates[mode].append(samples / wall)
                print(
                    f"round {r} {mode:9s}: {samples / wall:7.1f} samples/s ({wall:.2f} s, start-up included)",
                    flush=True,
                )
        ratio = [p / t for p, t in zip(rates["processes"], rates["threads"], strict=True)]
        result = {
            "what": "drain of small staged samples (hidden 64, 100-330 tokens) to a tmpfs, draft vocabulary counted, "
            "run check passing; alternating rounds; samples/s include start-up",
            "format": args.format,
            "samples": samples,
            "staged_bytes": nbytes,
            "cpus": os.cpu_count(),
            "workers": args.workers,
            "threads_samples_per_s": dt.spread(rates["threads"]),
            "processes_samples_per_s": dt.spread(rates["processes"]),
            "processes_over_threads": dt.spread(ratio),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result))
        print(f"processes over threads: {statistics.median(ratio):.3f}")
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
