"""Regeneration throughput: ``hsextract regenerate`` against a plain asyncio loop of the ``openai``
client, at the same concurrency on the same server, side by side in one run; and the generation
profile's radix cache on against off on the same multi-turn conversations.

Two SGLang servers serve the same model without the capture: one in the generation profile (radix
cache on; on a GPU, decode CUDA graphs as SGLang sets them), one with the capture profile's flags
(radix cache off). On CPU the model is the tiny Llama; on a GPU (``--device cuda``, the GPU tier's
bundle, ``bench/gpu/``) it is the 8B-shaped random model of ``bench/gpu/gen_llama8b.py``, whose
word-level tokenizer spells every token it generates, and both servers share one GPU. Both stay up and the timed
rounds alternate (hsextract on radix-on, openai on radix-on, hsextract on radix-off, ...), each
after ``/flush_cache``, so load from other processes falls on every side alike. Both clients do
the same work: every assistant turn of every conversation in order, each on the history of the
replies regenerated before it, greedy, ``--max-new-tokens`` per reply (the random model never
stops early, so every round generates the same number of tokens; the few prompts it answers with
blanks only end their conversation on both sides). hsextract's rounds include
what the command really does: reading the dataset, the resume bookkeeping, an fsynced line per
conversation, the status file.

    python bench/regenerate.py [--conversations 48] [--concurrency 16] [--rounds 5] \
        [--json bench/results/regenerate_cpu.json]
    python3 bench/regenerate.py --device cuda --bundle .gpu    # on the H200 machine (-> regenerate_gpu.json)

The last line printed is the ratio (hsextract / openai tokens per second, medians).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "tests")]

import requests  # noqa: E402
from common import machine_info  # noqa: E402
from hsextract.regen.config import RegenConfig  # noqa: E402
from hsextract.regen.runner import RegenerateRun  # noqa: E402
from hsextract.tiny_model import ensure_tiny_model  # noqa: E402
from support.sglang_server import ServerHandle, start_server, wait_healthy  # noqa: E402

GPU_SITE = Path("/tmp/hsx-gpu-site")  # where bench/gpu/gpu_env.py installs the bundle

WORDS = [
    "the",
    "capital",
    "city",
    "of",
    "france",
    "is",
    "paris",
    "hello",
    "world",
    "this",
    "a",
    "tiny",
    "test",
    "model",
    "for",
    "sglang",
    "deep",
    "learning",
    "models",
    "produce",
    "hidden",
    "states",
    "at",
    "every",
    "layer",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
]


def write_dataset(path: Path, n: int, seed: int, words: list[str] = WORDS) -> list[list[dict]]:
    """`n` conversations of 2-4 user turns with 20-80-word messages (the replies are regenerated)."""
    rng = random.Random(seed)
    convs = []
    for i in range(n):
        msgs = []
        for _ in range(2 + i % 3):
            msgs.append({"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randint(20, 80)))})
            msgs.append({"role": "assistant", "content": "a source reply"})
        convs.append(msgs)
    path.write_text("".join(json.dumps({"id": f"c{i}", "messages": m}) + "\n" for i, m in enumerate(convs)))
    return convs


def run_hsextract(url: str, dataset: Path, out: Path, concurrency: int, max_new: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)  # a whole run each time, never a resume of an earlier one
    cfg = RegenConfig(
        dataset=dataset,
        output=out,
        servers=[url],
        max_new_tokens=max_new,
        temperature=0.0,
        concurrency=concurrency,
        log_every_s=3600,
    )
    started = time.perf_counter()
    stats = RegenerateRun(cfg).run()
    wall = time.perf_counter() - started
    if set(stats.failed) - {"empty_reply"} or stats.ok + sum(stats.failed.values()) != stats.conversations_total:
        raise SystemExit(f"hsextract regenerate did not finish every conversation: {stats.summary()}")
    return {
        "tokens": stats.completion_tokens,
        "turns": stats.turns,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(stats.completion_tokens / wall, 1),
    }


def run_openai(url: str, convs: list[list[dict]], concurrency: int, max_new: int) -> dict:
    """The same turns through the openai client: the plain loop a user would write."""
    import openai

    async def main() -> tuple[int, int]:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
        model = (await client.models.list()).data[0].id
        sem = asyncio.Semaphore(concurrency)
        tokens = turns = 0

        async def one(msgs: list[dict]) -> None:
            nonlocal tokens, turns
            async with sem:
                history: list[dict] = []
                for m in msgs:
                    if m["role"] != "assistant":
                        history.append(m)
                        continue
                    r = await client.chat.completions.create(
                        model=model, messages=history, temperature=0.0, max_tokens=max_new
                    )
                    text = r.choices[0].message.content or ""
                    tokens += r.usage.completion_tokens
                    if not text.strip():
                        break  # the same rule as hsextract's: a blank reply ends the conversation
                    history.append({"role": "assistant", "content": text})
                    turns += 1

        await asyncio.gather(*(one(m) for m in convs))
        await client.close()
        return tokens, turns

    started = time.perf_counter()
    tokens, turns = asyncio.run(main())
    wall = time.perf_counter() - started
    return {"tokens": tokens, "turns": turns, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 1)}


def _median(rounds: list[dict]) -> float:
    return statistics.median(r["tokens_per_s"] for r in rounds)


def cpu_servers(work: Path, port: int) -> tuple[dict[str, ServerHandle], list[str], str]:
    """The tiny Llama on CPU, radix cache on and off; the words of its conversations; what ran."""
    model = ensure_tiny_model("llama", REPO / ".work" / "models" / "bench-llama")
    servers = {}
    for i, (name, radix) in enumerate((("radix_on", True), ("radix_off", False))):
        servers[name] = start_server(
            model,
            port=port + i,
            dump_dir=work / name / "dump",
            log_dir=work / name / "logs",
            capture=False,
            radix_cache=radix,
            max_total_tokens=16384,
            chunked_prefill_size=2048,
        )
    return servers, WORDS, "SGLang 0.5.23 on CPU (tiny Llama, 8 layers, hidden 64)"


def gpu_servers(
    work: Path, port: int, bundle: Path, gpu: int, concurrency: int
) -> tuple[dict[str, ServerHandle], list[str], str]:
    """The 8B-shaped model on one GPU: the generation profile (radix cache on) and the capture
    profile's flags without the capture (radix cache off), both started at once."""
    sys.path[:0] = [str(REPO / "bench" / "gpu"), str(REPO / "bench")]
    import capture_server_gpu
    import gen_llama8b
    import gpu_env
    from gpu_server import ServerSpec, start

    env = gpu_env.install(bundle, GPU_SITE, work / "install.log")
    sys.path.insert(0, str(GPU_SITE))  # the bundle's openai client, for the plain loop
    model = capture_server_gpu.prepare_model(env, work, gpu)
    # One GPU holds both: a capped KV pool each (131072 tokens, 16 GiB), decode graphs up to the
    # concurrency (every batch size the bench makes). Prefill graphs stay off on this machine: SGLang's
    # breakable prefill graph fails to capture over the tier's pure-torch kernel stand-in
    # (``assert graph is not None`` in breakable_cuda_graph.py); decode graphs, which regeneration
    # lives on, capture fine.
    flags = (
        "--chunked-prefill-size",
        "8192",
        "--max-total-tokens",
        "131072",
        "--mem-fraction-static",
        "0.9",
        "--max-running-requests",
        str(concurrency),
        "--cuda-graph-max-bs-decode",
        str(concurrency),
        "--disable-prefill-cuda-graph",
    )
    servers = {
        "radix_on": start(
            ServerSpec("regen-generation", model, port, (gpu,), False, flags, profile="generation"), env, work
        ),
        "radix_off": start(ServerSpec("regen-radix-off", model, port + 1, (gpu,), False, flags), env, work),
    }
    try:
        for handle in servers.values():
            wait_healthy(handle, 900)
    except BaseException:
        for handle in servers.values():
            handle.stop()
        raise
    cfg = json.loads((model / "config.json").read_text())
    words = [gen_llama8b.word(i) for i in range(1000, 1300)]
    return (
        servers,
        words,
        (
            f"SGLang 0.5.23 on {capture_server_gpu.nvidia_smi_names()[gpu]} (random bf16 model of "
            f"Llama-3-8B's shape: {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']})"
        ),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--bundle", type=Path, default=REPO / ".gpu", help="the GPU tier's bundle (--device cuda)")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--conversations", type=int, help="default: 48 on CPU, 96 on a GPU")
    ap.add_argument("--concurrency", type=int, help="default: 16 on CPU, 64 on a GPU")
    ap.add_argument("--max-new-tokens", type=int, help="default: 32 on CPU, 128 on a GPU")
    ap.add_argument("--rounds", type=int, default=5, help="alternating timed rounds per side (medians reported)")
    ap.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("HSEXTRACT_BENCH_PORT", "31292")),
        help="first of two ports (radix cache on, off)",
    )
    ap.add_argument("--work", type=Path, help="scratch directory (default: a new temporary one, removed after)")
    ap.add_argument("--json", type=Path, help="default: bench/results/regenerate_cpu.json or regenerate_gpu.json")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    conversations = args.conversations or (96 if cuda else 48)
    concurrency = args.concurrency or (64 if cuda else 16)
    max_new = args.max_new_tokens or (128 if cuda else 32)
    out_json = args.json or REPO / "bench" / "results" / f"regenerate_{'gpu' if cuda else 'cpu'}.json"

    work = args.work or Path(tempfile.mkdtemp(prefix="hsx-bench-regen-"))
    work.mkdir(parents=True, exist_ok=True)
    servers: dict[str, ServerHandle] = {}
    rounds: dict[str, list[dict]] = {"hsextract": [], "openai": [], "hsextract_radix_off": []}
    try:
        if cuda:
            servers, words, what = gpu_servers(work, args.port, args.bundle, args.gpu, concurrency)
        else:
            servers, words, what = cpu_servers(work, args.port)
        dataset = work / "data.jsonl"
        convs = write_dataset(dataset, conversations, seed=0, words=words)
        # warm-up: each server and each client once
        run_hsextract(servers["radix_on"].url, dataset, work / "warm-on", concurrency, max_new)
        run_hsextract(servers["radix_off"].url, dataset, work / "warm-off", concurrency, max_new)
        run_openai(servers["radix_on"].url, convs, concurrency, max_new)
        sides = [("hsextract", "radix_on"), ("openai", "radix_on"), ("hsextract_radix_off", "radix_off")]
        for r in range(args.rounds):
            for side, server_name in sides:
                url = servers[server_name].url
                requests.post(f"{url}/flush_cache", timeout=60)
                if side == "openai":
                    res = run_openai(url, convs, concurrency, max_new)
                else:
                    res = run_hsextract(url, dataset, work / f"{side}-{r}", concurrency, max_new)
                rounds[side].append(res)
                print(
                    f"round {r} {side:20s} {res['tokens']} tokens, {res['turns']} turns in {res['wall_s']:.1f} s"
                    f" = {res['tokens_per_s']:.0f} tokens/s",
                    flush=True,
                )
    finally:
        for server in servers.values():
            server.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    per_round = [
        h["tokens_per_s"] / o["tokens_per_s"] for h, o in zip(rounds["hsextract"], rounds["openai"], strict=True)
    ]
    ratio = _median(rounds["hsextract"]) / _median(rounds["openai"])
    radix = _median(rounds["hsextract"]) / _median(rounds["hsextract_radix_off"])
    result = {
        "benchmark": "regenerate",
        "what": f"hsextract regenerate vs a plain asyncio loop of the openai client, {what}, same concurrency, "
        "same server, greedy, every turn",
        "device": args.device,
        "conversations": conversations,
        "turns": rounds["hsextract"][0]["turns"],
        "concurrency": concurrency,
        "max_new_tokens": max_new,
        "rounds": args.rounds,
        "median_tokens_per_s": {k: _median(v) for k, v in rounds.items()},
        "ratio_hsextract_over_openai": round(ratio, 3),
        "ratio_per_round": {
            "min": round(min(per_round), 3),
            "median": round(statistics.median(per_round), 3),
            "max": round(max(per_round), 3),
        },
        "radix_on_over_off": round(radix, 3),
        "per_round": rounds,
        "machine": machine_info(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(result, indent=2) + "\n")
    if os.environ.get("OUT"):  # the device tool brings back what is under $OUT
        Path(os.environ["OUT"], out_json.name).write_text(json.dumps(result, indent=2) + "\n")
    print(f"radix cache on / off (hsextract, multi-turn): {radix:.3f}")
    print(
        f"per-round hsextract / openai: min {min(per_round):.3f} median {statistics.median(per_round):.3f} "
        f"max {max(per_round):.3f}"
    )
    print(f"hsextract / openai: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
