"""End-to-end extraction throughput on CPU: the same dataset through the real SGLang server with the
capture on and with the capture off (plain prefill, no patch), side by side in one run.

Both runs use the real client (``hsextract.client``: tokenization, records, bounded in-flight
requests, status), the same tiny Llama model, the same server flags and the same 200-sample
dataset; both servers run at once and the timed runs alternate between them (median of
``--rounds`` per side), after a short warm-up of each. What differs is only whether
the capture patch is loaded, so the ratio is the capture's cost as the client sees it. The drain
does not run during the timed part (its throughput is benchmarked on its own); the staged dumps
are counted to show the capture really wrote every sample.

    python bench/extract_e2e.py [--samples 200] [--rounds 3] [--port 31290] [--json bench/results/extract_e2e.json]

The last line printed is the ratio (capture on / capture off tokens per second).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "tests")]

from common import machine_info  # noqa: E402
from hsextract.client.backpressure import Watermark  # noqa: E402
from hsextract.client.runner import ExtractConfig, ExtractRun  # noqa: E402
from hsextract.records import load_or_create_run_id, parse_rid  # noqa: E402
from hsextract.staging import iter_complete  # noqa: E402
from hsextract.tiny_model import ensure_tiny_model  # noqa: E402
from support.sglang_server import start_server  # noqa: E402

_TEXT = ("the capital city of france is paris hello world this is a tiny test model for sglang deep learning "
         "models produce hidden states at every layer we dump auxiliary during prefill to shared memory quick "
         "brown fox jumps over lazy dog user asks question and assistant answers it politely")
WORDS = _TEXT.split()


def write_dataset(path: Path, n: int, seed: int) -> None:
    """`n` distinct OpenAI-style conversations of 1-3 turns, 4-30 words per message."""
    rng = random.Random(seed)

    def sentence() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 30))).capitalize() + "."

    with path.open("w") as f:
        for i in range(n):
            msgs = []
            for _ in range(1 + i % 3):
                msgs += [{"role": "user", "content": sentence()}, {"role": "assistant", "content": sentence()}]
            f.write(json.dumps({"messages": msgs}) + "\n")


def run_client(url: str, dataset: Path, model: Path, dump: Path, output: Path, in_flight: int) -> dict:
    cfg = ExtractConfig(server=url, dataset=dataset, model=model, dump_dir=dump, output=output,
                        max_in_flight=in_flight, shm_min_free=Watermark(bytes=0), max_staged=None,
                        log_every_s=3600)
    started = time.perf_counter()
    stats = ExtractRun(cfg).run()
    wall = time.perf_counter() - started
    if stats.ok != stats.samples_total:
        raise SystemExit(f"run through {url} answered {stats.ok} of {stats.samples_total} samples: {stats.summary()}")
    run_id = load_or_create_run_id(output)
    deadline = time.monotonic() + 30  # the capture finishes a dump's files just after the answer
    dumps = 0
    while time.monotonic() < deadline:
        dumps = sum(1 for d in iter_complete(dump) if (p := parse_rid(d.name)) and p.run_id == run_id)
        if dumps >= stats.ok or not any(True for _ in iter_complete(dump)):
            break
        time.sleep(0.2)
    for d in list(Path(dump).iterdir()):  # keep staging small between rounds
        shutil.rmtree(d, ignore_errors=True)
    return {"samples": stats.ok, "tokens": stats.tokens, "wall_s": round(wall, 3),
            "tokens_per_s": round(stats.tokens / wall, 1), "complete_dumps": dumps}


def _median(results: list[dict]) -> dict:
    """The round with the median tokens/s (a real round, not an average of rounds)."""
    return sorted(results, key=lambda r: r["tokens_per_s"])[len(results) // 2]


def _best_ratio(rounds: dict[str, list[dict]]) -> float:
    """Fastest capture-on round over fastest capture-off round: the least disturbed pair on a shared machine."""
    return max(r["tokens_per_s"] for r in rounds["capture_on"]) / max(r["tokens_per_s"] for r in rounds["capture_off"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--in-flight", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="alternating timed runs per side (median reported)")
    ap.add_argument("--chunked-prefill-size", type=int, default=512)
    ap.add_argument("--max-total-tokens", type=int, default=8192)
    ap.add_argument("--port", type=int, default=int(os.environ.get("HSEXTRACT_BENCH_PORT", "31290")),
                    help="first of two ports (capture off, capture on)")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "extract_e2e.json")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hsx-bench-e2e-"))
    servers = {}
    rounds: dict[str, list[dict]] = {"capture_off": [], "capture_on": []}
    try:
        model = ensure_tiny_model("llama", REPO / ".work" / "models" / "bench-llama")
        dataset, warmup = work / "data.jsonl", work / "warmup.jsonl"
        write_dataset(dataset, args.samples, seed=0)
        write_dataset(warmup, 10, seed=1)
        # Both servers stay up and the rounds alternate, so load from other processes on the
        # machine falls on both sides alike; the median round of each side is reported.
        for i, (name, capture) in enumerate((("capture_off", False), ("capture_on", True))):
            dump = Path(tempfile.mkdtemp(prefix=f"hsx-bench-{name}-", dir="/dev/shm"))
            servers[name] = (start_server(model, port=args.port + i, dump_dir=dump, log_dir=work / name / "logs",
                                          capture=capture, chunked_prefill_size=args.chunked_prefill_size,
                                          max_total_tokens=args.max_total_tokens), dump)
            run_client(servers[name][0].url, warmup, model, dump, work / name / "warmup-out", args.in_flight)
        for r in range(args.rounds):
            for name, (server, dump) in servers.items():
                res = run_client(server.url, dataset, model, dump, work / name / f"out{r}", args.in_flight)
                rounds[name].append(res)
                print(f"round {r} {name:12s} {res['tokens']} tokens in {res['wall_s']:.1f} s = "
                      f"{res['tokens_per_s']:.0f} tokens/s ({res['complete_dumps']} complete dumps)", flush=True)
    finally:
        for server, dump in servers.values():
            server.stop()
            shutil.rmtree(dump, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    on_dumps = {r["complete_dumps"] for r in rounds["capture_on"]}
    off_dumps = {r["complete_dumps"] for r in rounds["capture_off"]}
    if on_dumps != {args.samples} or off_dumps != {0}:
        raise SystemExit(f"capture wrote {on_dumps} dumps per round for {args.samples} samples "
                         f"(and {off_dumps} with the capture off)")
    off, on = _median(rounds["capture_off"]), _median(rounds["capture_on"])
    ratio = on["tokens_per_s"] / off["tokens_per_s"]
    best = _best_ratio(rounds)
    result = {
        "benchmark": "extract_e2e",
        "what": "client -> SGLang 0.5.23 on CPU (tiny Llama, 8 layers, hidden 64) with the capture on vs off",
        "samples": args.samples,
        "in_flight": args.in_flight,
        "chunked_prefill_size": args.chunked_prefill_size,
        "rounds": args.rounds,
        "capture_off": off,
        "capture_on": on,
        "ratio_on_over_off": round(ratio, 3),
        "ratio_best_rounds": round(best, 3),
        "per_round": rounds,
        "machine": machine_info(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"capture on / off (best rounds): {best:.3f}")
    print(f"capture on / off: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
