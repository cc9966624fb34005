"""How fast ``hsextract plan`` tokenizes a dataset, in samples per second, with 1 and with every core.

Generates a chat dataset (OpenAI messages, 1-3 turns of 4-30 words, as bench/extract_e2e.py) and
scans it with plan's own scanner (the client's reader and encoder: chat template rendered per
assistant turn, loss mask from offsets) using the tiny model's tokenizer, one process and all
cores in alternating rounds; prints the median samples/s of each (worker start-up included) and
saves bench/results/plan_rate.json. The last line is the all-core rate.

    python bench/plan_rate.py [--samples 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "bench")]

from common import machine_info  # noqa: E402
from extract_e2e import write_dataset  # noqa: E402
from hsextract.plan.scan import ScanSettings, scan  # noqa: E402
from hsextract.tiny_model import ensure_tiny_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "plan_rate.json")
    a = ap.parse_args()
    cores = os.cpu_count() or 1
    model = ensure_tiny_model("llama", REPO / ".work" / "models" / "bench-llama")
    rounds: dict[str, list[float]] = {"1": [], str(cores): []}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.jsonl"
        write_dataset(data, a.samples, seed=0)
        for r in range(a.rounds):
            for workers in (1, cores):
                t0 = time.perf_counter()
                res = scan(ScanSettings(data, model, workers=workers, progress=False))
                rate = res.samples / (time.perf_counter() - t0)
                rounds[str(workers)].append(rate)
                print(
                    f"round {r} {workers} process(es): {res.samples} samples, {res.tokens} tokens, "
                    f"{rate:,.0f} samples/s",
                    flush=True,
                )
    med = {k: statistics.median(v) for k, v in rounds.items()}
    result = {
        "benchmark": "plan_rate",
        "what": "hsextract plan's scan (client reader + chat template + loss mask) of a chat dataset, tiny Llama "
        "tokenizer; samples/s including worker start-up",
        "samples": a.samples,
        "rounds": a.rounds,
        "samples_per_s_median": {k: round(v, 1) for k, v in med.items()},
        "samples_per_s_rounds": {k: [round(x, 1) for x in v] for k, v in rounds.items()},
        "speedup": round(med[str(cores)] / med["1"], 3),
        "machine": machine_info(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"1 process: {med['1']:,.0f} samples/s")
    print(f"{cores} processes: {med[str(cores)]:,.0f} samples/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
