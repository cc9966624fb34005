"""End-to-end extraction throughput on CPU: the same dataset through the real SGLang server with the
capture on and with the capture off (plain prefill, no patch), side by side in one run.

Capture on: the real client (``hsextract.client``: tokenization, records, bounded in-flight
requests, the capture's confirmation of every sample, status). Capture off: the same samples,
encoded by the client's own encoder, sent as the same requests by a plain asyncio loop at the
same in-flight bound (the client checks with the capture that each sample was staged, from its
start-up probe on, so it does not run against a server without the capture). Same tiny Llama,
same server flags, same 200-sample dataset; both servers run at once and the timed runs
alternate between them (median of ``--rounds`` per side), after a short warm-up of each. The
ratio is the whole capture path's cost as a user sees it: the patch in the server and the
client's bookkeeping. The drain does not run during the timed part (its throughput is
benchmarked on its own, bench/drain_throughput.py and bench/drain_ab.py); the staged dumps are
counted to show the capture really wrote every sample. Like every pipeline figure, the result states
where the client's output was written (``output_root``) and the disk's ceiling there, measured in
the same call (`hsextract.ops.disk_ceiling`); ``drain_gb_per_s`` and
``whole_pipeline_on_disk_over_ceiling`` are null, as no drain runs.

    python bench/extract_e2e.py [--samples 200] [--rounds 3] [--port 31290] [--json bench/results/extract_e2e.json]

The last line printed is the ratio (capture on / capture off tokens per second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "tests")]

from common import machine_info, on_disk_keys  # noqa: E402
from hsextract.client.backpressure import Watermark  # noqa: E402
from hsextract.client.config import ExtractConfig  # noqa: E402
from hsextract.client.runner import ExtractRun  # noqa: E402
from hsextract.dataset.chat_template import Encoded, build_encoder  # noqa: E402
from hsextract.dataset.reader import Reject, read_dataset  # noqa: E402
from hsextract.formats import DEFAULT_FORMAT, final_hidden_for  # noqa: E402
from hsextract.ops.disk_ceiling import measure  # noqa: E402
from hsextract.output.run_id import load_or_create_run_id  # noqa: E402
from hsextract.staging.dumps import iter_complete  # noqa: E402
from hsextract.staging.records import parse_rid  # noqa: E402
from hsextract.tiny_model import ensure_tiny_model  # noqa: E402
from support.sglang_server import start_server  # noqa: E402

_TEXT = (
    "the capital city of france is paris hello world this is a tiny test model for sglang deep learning "
    "models produce hidden states at every layer we dump auxiliary during prefill to shared memory quick "
    "brown fox jumps over lazy dog user asks question and assistant answers it politely"
)
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


def cpu_seconds() -> float:
    """This process's CPU time (all threads, user + system): the client's cost whatever the server does."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_client(url: str, dataset: Path, model: Path, dump: Path, output: Path, in_flight: int) -> dict:
    cfg = ExtractConfig(
        server=url,
        dataset=dataset,
        model=model,
        dump_dir=dump,
        output=output,
        max_in_flight=in_flight,
        shm_min_free=Watermark(bytes=0),
        max_staged=None,
        log_every_s=3600,
    )
    started, cpu0 = time.perf_counter(), cpu_seconds()
    stats = ExtractRun(cfg).run()
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu0
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
    return {
        "samples": stats.ok,
        "tokens": stats.tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(stats.tokens / wall, 1),
        "complete_dumps": dumps,
        "cpu_ms_per_sample": round(1000 * cpu / max(stats.ok, 1), 3),
    }


def encode_dataset(dataset: Path, model: Path) -> list[list[int]]:
    """Every sample's token ids, as the client's encoder makes them (its defaults)."""
    encoder = build_encoder(model, None, None, "truncate")
    out = []
    for item in read_dataset(dataset):
        enc = item if isinstance(item, Reject) else encoder.encode(item)
        if not isinstance(enc, Encoded):
            raise SystemExit(f"the client's encoder rejects a bench sample: {enc}")
        out.append(enc.input_ids)
    return out


def run_plain(url: str, prompts: list[list[int]], in_flight: int) -> dict:
    """The capture-off side: the client's requests (prefill, one greedy token) from a plain loop."""
    import aiohttp

    async def main() -> None:
        sem = asyncio.Semaphore(in_flight)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

            async def one(i: int, ids: list[int]) -> None:
                body = {
                    "input_ids": ids,
                    "rid": f"plain-{i}",
                    "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                }
                async with sem, session.post(f"{url}/generate", json=body) as r:
                    if r.status != 200:
                        raise SystemExit(f"{url} answered {r.status}: {(await r.text())[:300]}")
                    await r.read()

            await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    started, cpu0 = time.perf_counter(), cpu_seconds()
    asyncio.run(main())
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu0
    tokens = sum(map(len, prompts))
    return {
        "samples": len(prompts),
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "complete_dumps": 0,
        "cpu_ms_per_sample": round(1000 * cpu / max(len(prompts), 1), 3),
    }


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
    ap.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("HSEXTRACT_BENCH_PORT", "31290")),
        help="first of two ports (capture off, capture on)",
    )
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "extract_e2e.json")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hsx-bench-e2e-"))
    ceiling = measure(work / "ceiling", [256 << 10, 1 << 20], (1, 4, 8), seconds_per_point=2.0).as_dict()
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
            servers[name] = (
                start_server(
                    model,
                    port=args.port + i,
                    dump_dir=dump,
                    log_dir=work / name / "logs",
                    capture=capture,
                    chunked_prefill_size=args.chunked_prefill_size,
                    max_total_tokens=args.max_total_tokens,
                    final_hidden=final_hidden_for(DEFAULT_FORMAT),
                ),
                dump,
            )
        prompts, warm_prompts = encode_dataset(dataset, model), encode_dataset(warmup, model)
        run_plain(servers["capture_off"][0].url, warm_prompts, args.in_flight)
        run_client(
            servers["capture_on"][0].url, warmup, model, servers["capture_on"][1], work / "warmup-out", args.in_flight
        )
        for r in range(args.rounds):
            for name, (server, dump) in servers.items():
                if name == "capture_off":
                    res = run_plain(server.url, prompts, args.in_flight)
                else:
                    res = run_client(server.url, dataset, model, dump, work / name / f"out{r}", args.in_flight)
                rounds[name].append(res)
                print(
                    f"round {r} {name:12s} {res['tokens']} tokens in {res['wall_s']:.1f} s = "
                    f"{res['tokens_per_s']:.0f} tokens/s ({res['complete_dumps']} complete dumps)",
                    flush=True,
                )
    finally:
        for server, dump in servers.values():
            server.stop()
            shutil.rmtree(dump, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    on_dumps = {r["complete_dumps"] for r in rounds["capture_on"]}
    off_dumps = {r["complete_dumps"] for r in rounds["capture_off"]}
    if on_dumps != {args.samples} or off_dumps != {0}:
        raise SystemExit(
            f"capture wrote {on_dumps} dumps per round for {args.samples} samples "
            f"(and {off_dumps} with the capture off)"
        )
    off, on = _median(rounds["capture_off"]), _median(rounds["capture_on"])
    ratio = on["tokens_per_s"] / off["tokens_per_s"]
    best = _best_ratio(rounds)
    result = {
        "benchmark": "extract_e2e",
        "what": "hsextract's client -> SGLang 0.5.23 on CPU (tiny Llama, 8 layers, hidden 64) with the capture, vs "
        "the same requests from a plain loop to the same server without it",
        "samples": args.samples,
        "in_flight": args.in_flight,
        "chunked_prefill_size": args.chunked_prefill_size,
        "rounds": args.rounds,
        "capture_off": off,
        "capture_on": on,
        "ratio_on_over_off": round(ratio, 3),
        "ratio_best_rounds": round(best, 3),
        # The client's own CPU per sample (all its threads) against the plain loop's, in the same process:
        # what one client process can sustain, whatever the (slow, CPU) server does.
        "client_cpu_ms_per_sample": on["cpu_ms_per_sample"],
        "plain_loop_cpu_ms_per_sample": off["cpu_ms_per_sample"],
        "per_round": rounds,
        **on_disk_keys(str(work), ceiling["disk_ceiling_gb_per_s"], None),
        "disk_ceiling": ceiling,
        "machine": machine_info(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"client CPU per sample: {on['cpu_ms_per_sample']:.2f} ms; plain loop: {off['cpu_ms_per_sample']:.2f} ms")
    print(f"capture on / off (best rounds): {best:.3f}")
    print(f"capture on / off: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
