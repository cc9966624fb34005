"""Capture overhead through the real SGLang 0.5.23 server on a GPU: a plain server against a capture
server with the same flags, prefill-only requests, side by side in one run.

Both servers serve the same random-weight model of Llama-3-8B's shape (``bench/gpu/gen_llama8b.py``)
on the same GPU, so no difference between GPUs enters the ratio; the one not being measured is
idle (``--sleep-on-idle``). They differ only by the capture patch. For each case (prompt length,
requests in flight) both are warmed up, then timed rounds alternate between them (plain first in
even rounds, capture first in odd ones), each round sending the same prompts to both. A round's
throughput is its prompt tokens over the time from the first request to the last reply.

During a capture round a stand-in for the drain checks each staged dump as it completes and
removes it (the drain's own throughput is benchmarked by ``bench/drain_throughput.py``, the whole
product by ``bench/gpu/pipeline_gpu.py``): each dump's token ids must be the ones its request sent
and its rows must have the fingerprint the forward pass computed (``done.json``); complete, valid
dumps must equal the round's requests, with no failure marker (``<rid>/failed.json``) and no
capture log line about lost rows. Reported per case: tokens/s of both (median and spread), the
ratio of the medians and of each round pair, GB/s staged, and the dump counts. Each round also
records what SGLang's scheduler logged of its prefill batches (their size, how often its queue was
empty, the time between them), which tells whether the GPU, the scheduler or the supply of
requests set the pace.

Two optional sides isolate parts of the cost: ``--uncaptured-side`` times the capture server sent
rids outside its prefix (the same process, without any per-request work of the capture), and
``--kept-side`` times capture rounds whose dumps are removed only after the round (without the
drain's removals beside it). ``--capture-writer-threads`` sets the capture server's writer threads;
the capture server writes as the project does by default, from a child process (``writer_process``);
``--capture-in-process-writer`` makes it write from threads of the scheduler's process instead, and
``--other-writer-side`` adds a second capture server that writes the other way, timed as one more side.

    python3 bench/capture_server_gpu.py --bundle .gpu   # on the GPU host (bench/gpu/build_bundle.py made .gpu)

``bench/gpu/run_all.py`` runs it after the capture checks, in the same invocation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench" / "gpu"), str(REPO / "files" / "python")]

import gpu_env  # noqa: E402
from gpu_server import ServerHandle, ServerSpec, capture_flags, start, wait_healthy  # noqa: E402
from hsextract import fingerprint  # noqa: E402
from hsextract.capture.config import WRITER_PROCESS_DEFAULT  # noqa: E402
from hsextract.staging import dumps as staging  # noqa: E402
from hsextract.staging.dumps import DONE_FILE, STATES_FILE, iter_dump_dirs  # noqa: E402

FAILED_FILE = getattr(staging, "FAILED_FILE", "failed.json")
LOSS_PATTERNS = ("rows are lost", "could not queue", "cannot write", "will not be marked done")


@dataclass(frozen=True)
class Case:
    prompt_tokens: int
    in_flight: int
    requests: int  # per timed round, at most (a time budget may lower it)

    @property
    def name(self) -> str:
        return f"{self.prompt_tokens}-tokens-{self.in_flight}-in-flight"

    @classmethod
    def parse(cls, text: str) -> Case:
        tokens, in_flight, requests = (int(x) for x in text.split("x"))
        return cls(tokens, in_flight, requests)


GPU_CASES = (Case(1024, 64, 384), Case(128, 256, 2048))
CPU_CASES = (Case(64, 8, 32),)


def server_args(env: gpu_env.GpuEnv) -> tuple[str, ...]:
    """The flags of both servers (beyond the capture's own, which `gpu_server.start` adds to both)."""
    if not env.cuda:
        return ("--chunked-prefill-size", "512", "--max-total-tokens", "8192", "--max-running-requests", "16")
    # Two 8B servers share one GPU: a capped KV pool (131072 tokens, 16 GiB) each, and a high static
    # fraction so SGLang's headroom (the rest of the memory it found free at start) stays small.
    return capture_flags(0.9)


def start_pair(
    model: Path,
    env: gpu_env.GpuEnv,
    work: Path,
    gpu: int,
    port: int,
    writer_threads: int = 0,
    writer_process: bool = WRITER_PROCESS_DEFAULT,
    other_writer_server: bool = False,
) -> dict[str, ServerHandle]:
    """Start the plain and the capture server on ``gpu`` (no wait); with ``other_writer_server``,
    a second capture server too, whose capture writes the other way (in-process if ``writer_process``,
    else from a child process)."""
    args = server_args(env)
    servers = {
        "plain": start(ServerSpec("bench-plain", model, port, (gpu,), False, args), env, work),
        "capture": start(
            ServerSpec(
                "bench-capture",
                model,
                port + 1,
                (gpu,),
                True,
                args,
                writer_threads=writer_threads,
                writer_process=writer_process,
            ),
            env,
            work,
        ),
    }
    if other_writer_server:
        servers[OTHER_WRITER] = start(
            ServerSpec(
                "bench-capture-other-writer",
                model,
                port + 2,
                (gpu,),
                True,
                args,
                writer_threads=writer_threads,
                writer_process=not writer_process,
            ),
            env,
            work,
        )
    return servers


def staged_fingerprint(states) -> str:
    """The fingerprint of a staged dump's rows as the capture took it: of the bf16 rows, or of an FP8
    dump's stored rows (each FP8 row followed by its scale, hsextract.fp8.stored_row_values)."""
    if states.scales is None:
        return fingerprint.of_states(states.hidden, states.input_ids)
    from hsextract import fp8

    values = fp8.stored_row_values(states.hidden, states.scales, states.input_ids)
    return fingerprint.to_text(fingerprint.combine(values.numpy(), 0))


class StagingCounter:
    """Checks, counts and removes the dumps of one round as they complete (a stand-in for the drain):
    a dump counts as complete only if its ids are its request's and its rows have the fingerprint
    the forward pass computed; any other is counted as wrong.

    It runs in a process of its own, as the drain does: as a thread of the bench it would share the
    GIL with the client's event loop, and its listing and removal of 200 dumps a second in the
    short-prompt case would slow the sending of the capture rounds alone."""

    def __init__(self, dump_dir: Path, run_id: str, prompts: list[list[int]], remove: bool = True):
        self.dump_dir, self.prefix, self.remove = Path(dump_dir), f"hsx-{run_id}-", remove
        self.prompts = prompts
        self._counted: set[str] = set()
        self.complete = self.failed = self.staged_bytes = self.wrong = 0
        self.last_seen = time.monotonic()
        ctx = multiprocessing.get_context("fork")
        self._shared = ctx.Array("d", [0, 0, 0, self.last_seen, 0])  # complete, failed, bytes, last seen, wrong
        self._done = ctx.Event()
        self._proc = ctx.Process(target=self._run, daemon=True, name="staging-counter")

    def start(self) -> None:
        self._proc.start()

    def _run(self) -> None:
        while not self._done.is_set():
            self.sweep()
            self._done.wait(0.02)
        self.sweep()

    def sweep(self) -> None:
        """Count and remove this round's finished dumps (in the counter's process, or directly)."""
        for d in iter_dump_dirs(self.dump_dir):
            if not d.name.startswith(self.prefix) or d.name in self._counted:
                continue
            if (d / DONE_FILE).exists():
                self.staged_bytes += (d / STATES_FILE).stat().st_size
                if self.valid(d):
                    self.complete += 1
                else:
                    self.wrong += 1
            elif (d / FAILED_FILE).exists():
                self.failed += 1
            else:
                continue
            self.last_seen = time.monotonic()
            if self.remove:
                shutil.rmtree(d, ignore_errors=True)
            else:
                self._counted.add(d.name)
            with self._shared.get_lock():
                self._shared[:] = [self.complete, self.failed, self.staged_bytes, self.last_seen, self.wrong]

    def valid(self, d: Path) -> bool:
        """The dump holds its request's ids, and the rows the forward pass fingerprinted."""
        try:
            marker, states = staging.read_done_marker(d), staging.read_states(d)
        except Exception:
            return False
        index = int(d.name.rsplit("-", 1)[1])
        return states.input_ids.tolist() == self.prompts[index] and marker.fingerprint == staged_fingerprint(states)

    def _read(self) -> None:
        with self._shared.get_lock():
            complete, failed, staged, last, wrong = self._shared[:]
        self.complete, self.failed, self.staged_bytes, self.last_seen = int(complete), int(failed), int(staged), last
        self.wrong = int(wrong)

    def wait_for(self, expected: int, quiet_s: float = 30) -> None:
        """Until ``expected`` dumps are counted, or nothing new came for ``quiet_s`` seconds."""
        self._read()
        while self.complete + self.failed + self.wrong < expected and time.monotonic() - self.last_seen < quiet_s:
            time.sleep(0.05)
            self._read()
        self._done.set()
        self._proc.join(timeout=10)
        self._read()

    def remove_all(self) -> None:
        """Remove this round's dumps (after the round, for a counter that kept them during it)."""
        for d in iter_dump_dirs(self.dump_dir):
            if d.name.startswith(self.prefix):
                shutil.rmtree(d, ignore_errors=True)


async def _send(url: str, run_id: str, prompts: list[list[int]], in_flight: int, rid_prefix: str = "hsx") -> float:
    import aiohttp

    sem = asyncio.Semaphore(in_flight)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(i: int, ids: list[int]) -> None:
            body = {
                "input_ids": ids,
                "rid": f"{rid_prefix}-{run_id}-{i}",
                "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            }
            async with sem, session.post(f"{url}/generate", json=body) as r:
                if r.status != 200:
                    raise RuntimeError(f"{url} answered {r.status}: {(await r.text())[:500]}")
                await r.read()

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        return time.perf_counter() - t0


def make_prompts(case: Case, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 300) for _ in range(case.prompt_tokens)] for _ in range(n)]


PREFILL_LINE = re.compile(
    r"Prefill batch.*?#new-seq: (\d+), #new-token: (\d+),.*?#running-req: (\d+), "
    r"#queue-req: (\d+),.*?input throughput \(token/s\): ([\d.]+)"
)


def scheduler_stats(log_text: str) -> dict:
    """What SGLang's scheduler logged of one round's prefill batches: how many, their size, how
    often its queue was empty when a batch started (the client did not keep it fed), and the time
    between batches (SGLang's own gap: new tokens over its logged input throughput)."""
    rows = [tuple(float(x) for x in m.groups()) for m in PREFILL_LINE.finditer(log_text)]
    gaps_ms = sorted(1000 * tok / thr for _, tok, _, _, thr in rows if thr > 0)
    if not rows:
        return {"batches": 0}
    return {
        "batches": len(rows),
        "median_new_seq": statistics.median(r[0] for r in rows),
        "median_queue_req": statistics.median(r[3] for r in rows),
        "empty_queue_share": round(sum(r[3] == 0 for r in rows) / len(rows), 3),
        "median_gap_ms": round(statistics.median(gaps_ms), 1) if gaps_ms else None,
        "p90_gap_ms": round(gaps_ms[int(0.9 * (len(gaps_ms) - 1))], 1) if gaps_ms else None,
        "max_gap_ms": round(gaps_ms[-1], 1) if gaps_ms else None,
        "sum_gap_s": round(sum(gaps_ms) / 1000, 3),
    }


def run_round(
    server: ServerHandle,
    case: Case,
    prompts: list[list[int]],
    capture: bool,
    remove_during_round: bool = True,
    rid_prefix: str = "hsx",
) -> dict:
    """One timed round on one server; with the capture, the staged dumps counted (and removed during
    the round as the drain would, or, with ``remove_during_round`` False, only after it). Rids outside
    the capture's prefix (``rid_prefix``) are served but never captured."""
    run_id = secrets.token_hex(4)
    counter = StagingCounter(server.dump_dir, run_id, prompts, remove=remove_during_round) if capture else None
    if counter:
        counter.start()
    log_from = server.log_path.stat().st_size
    wall = asyncio.run(_send(server.url, run_id, prompts, case.in_flight, rid_prefix))
    out = {
        "requests": len(prompts),
        "tokens": len(prompts) * case.prompt_tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(len(prompts) * case.prompt_tokens / wall, 1),
    }
    with open(server.log_path, "rb") as f:
        f.seek(log_from)
        out["scheduler"] = scheduler_stats(f.read().decode(errors="replace"))
    if counter:
        replied = time.monotonic()
        counter.wait_for(len(prompts))
        if not remove_during_round:
            counter.remove_all()
        out.update(
            complete_dumps=counter.complete,
            failure_markers=counter.failed,
            wrong_dumps=counter.wrong,
            staged_gb=round(counter.staged_bytes / 1e9, 3),
            staged_gb_per_s=round(counter.staged_bytes / 1e9 / wall, 3),
            staging_lag_s=round(max(0.0, counter.last_seen - replied), 3),
        )
    return out


def _spread(values: list[float]) -> dict:
    med = statistics.median(values)
    return {
        "median": round(med, 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
        "spread_pct": round(100 * (max(values) - min(values)) / med, 2),
    }


SIDES = ("plain", "capture")
# The capture server again, its dumps removed only once the round is over: compared with "capture",
# it tells what the removal of the staged files (the drain's work) costs the server while it runs.
KEPT = "capture-kept"
# The capture server again, sent rids outside its prefix: SGLang's own share of the capture (the aux
# states it gathers at the layer boundaries of every batch) without any per-request work of ours.
# Compared with "capture", on the same server process, it isolates the per-request cost from
# everything that differs between two server processes (where the OS placed them, their start).
UNCAPTURED = "capture-server-uncaptured"
# A second capture server whose capture writes the other way (capture config writer_process): compared
# with "capture", it tells what moving the per-request work out of the scheduler's process buys.
OTHER_WRITER = "capture-other-writer"
CAPTURED_SIDES = ("capture", KEPT, OTHER_WRITER)


def server_of(side: str) -> str:
    """The server a side's rounds go to."""
    return side if side in ("plain", OTHER_WRITER) else "capture"


def round_order(sides: tuple[str, ...], r: int) -> tuple[str, ...]:
    """Round ``r``'s order of the sides: rotated each round, so none is always first."""
    k = r % len(sides)
    return sides[k:] + sides[:k]


def measure(
    servers: dict[str, ServerHandle],
    cases: tuple[Case, ...],
    rounds: int,
    deadline: float,
    say=print,
    kept_side: bool = False,
    uncaptured_side: bool = False,
) -> dict:
    """Warm both servers up per case, then alternate timed rounds; fewer requests per round where
    the deadline (time.monotonic) would otherwise be passed. Returns the JSON-ready result."""
    results = []
    sides = (
        SIDES
        + ((KEPT,) if kept_side else ())
        + ((UNCAPTURED,) if uncaptured_side else ())
        + ((OTHER_WRITER,) if OTHER_WRITER in servers else ())
    )
    for n, case in enumerate(cases):
        warm = make_prompts(case, min(case.requests, max(2 * case.in_flight, 64)), seed=10_000 + n)
        speeds = []
        for side in [s for s in sides if s in servers]:
            res = run_round(servers[side], case, warm, side in CAPTURED_SIDES)
            speeds.append(res["tokens_per_s"])
            say(f"warm-up {case.name} {side}: {res}")
        left = deadline - time.monotonic()
        share = left / (len(cases) - n) / (len(sides) * rounds) - 5  # seconds per timed round, 5 s for staging
        fit = int(share * min(speeds) / case.prompt_tokens)
        requests = max(case.in_flight, min(case.requests, fit))
        rows: dict[str, list[dict]] = {side: [] for side in sides}
        for r in range(rounds):
            prompts = make_prompts(case, requests, seed=r)
            for side in round_order(sides, r):
                res = run_round(
                    servers[server_of(side)],
                    case,
                    prompts,
                    side in CAPTURED_SIDES,
                    remove_during_round=side != KEPT,
                    rid_prefix="uncaptured" if side == UNCAPTURED else "hsx",
                )
                rows[side].append(res)
                say(f"round {r} {case.name} {side}: {res}")
        plain = [x["tokens_per_s"] for x in rows["plain"]]
        capture = [x["tokens_per_s"] for x in rows["capture"]]
        pairs = [c / p for c, p in zip(capture, plain, strict=True)]
        captured = [x for side in sides if side in CAPTURED_SIDES for x in rows[side]]
        dumps_ok = all(x["complete_dumps"] == x["requests"] and x["failure_markers"] == 0 for x in captured)
        result = {
            "case": case.name,
            "prompt_tokens": case.prompt_tokens,
            "in_flight": case.in_flight,
            "requests_per_round": requests,
            "rounds": rounds,
            "plain_tokens_per_s": _spread(plain),
            "capture_tokens_per_s": _spread(capture),
            "ratio_of_medians": round(statistics.median(capture) / statistics.median(plain), 4),
            "ratio_per_round_pair": {
                "median": round(statistics.median(pairs), 4),
                "min": round(min(pairs), 4),
                "max": round(max(pairs), 4),
            },
            "staged_gb_per_s_median": statistics.median(x["staged_gb_per_s"] for x in rows["capture"]),
            "complete_dumps_equal_requests": dumps_ok,
            "scheduler_median_gap_ms": {
                side: statistics.median(x["scheduler"].get("median_gap_ms") or 0 for x in rows[side]) for side in sides
            },
            "per_round": rows,
        }
        if kept_side:
            kept = [x["tokens_per_s"] for x in rows[KEPT]]
            result["capture_kept_tokens_per_s"] = _spread(kept)
            result["ratio_kept_of_medians"] = round(statistics.median(kept) / statistics.median(plain), 4)
        if OTHER_WRITER in rows:
            other = [x["tokens_per_s"] for x in rows[OTHER_WRITER]]
            other_pairs = [o / c for o, c in zip(other, capture, strict=True)]
            result["capture_other_writer_tokens_per_s"] = _spread(other)
            result["ratio_other_writer_of_medians"] = round(statistics.median(other) / statistics.median(plain), 4)
            result["other_writer_over_capture"] = {
                "of_medians": round(statistics.median(other) / statistics.median(capture), 4),
                "round_pairs": {
                    "median": round(statistics.median(other_pairs), 4),
                    "min": round(min(other_pairs), 4),
                    "max": round(max(other_pairs), 4),
                },
            }
        if uncaptured_side:
            same = [x["tokens_per_s"] for x in rows[UNCAPTURED]]
            same_pairs = [c / u for c, u in zip(capture, same, strict=True)]
            result["capture_server_uncaptured_tokens_per_s"] = _spread(same)
            result["ratio_to_uncaptured_of_medians"] = round(statistics.median(capture) / statistics.median(same), 4)
            result["ratio_to_uncaptured_per_round_pair"] = {
                "median": round(statistics.median(same_pairs), 4),
                "min": round(min(same_pairs), 4),
                "max": round(max(same_pairs), 4),
            }
        results.append(result)
    log = servers["capture"].log_path.read_text(errors="replace")
    lost = [line for line in log.splitlines() if any(p in line for p in LOSS_PATTERNS)]
    return {
        "cases": results,
        "capture_log_lines_about_lost_rows": len(lost),
        "capture_blocked_log_lines": log.count("capture blocked"),
        "ok": not lost and all(c["complete_dumps_equal_requests"] for c in results),
    }


def nvidia_smi_names() -> list[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout
    except OSError:
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=REPO / ".gpu", help="the bundle built by bench/gpu/build_bundle.py")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run with the tiny Llama")
    ap.add_argument("--model", type=Path, help="model directory (default: generate the 8B-shaped model)")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--case", action="append", type=Case.parse, help="TOKENSxIN_FLIGHTxREQUESTS, repeatable")
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--port", type=int, default=30300)
    ap.add_argument("--work", type=Path, default=Path("/tmp/hsx-gpu-bench"))
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "capture_server_gpu.json")
    ap.add_argument(
        "--capture-writer-threads",
        type=int,
        default=0,
        help="the capture server's writer threads (default: the capture's own, 8 on a GPU)",
    )
    ap.add_argument(
        "--capture-in-process-writer",
        action="store_true",
        help="the capture server writes from threads of SGLang's scheduler process, not from a child "
        "process (writer_process, the default)",
    )
    ap.add_argument(
        "--other-writer-side",
        action="store_true",
        help="also time a second capture server whose capture writes the other way",
    )
    ap.add_argument(
        "--uncaptured-side",
        action="store_true",
        help="also time the capture server with rids outside its prefix (same process, no capture)",
    )
    ap.add_argument(
        "--kept-side", action="store_true", help="also time capture rounds whose dumps are removed only after the round"
    )
    args = ap.parse_args()
    deadline = time.monotonic() + args.budget_s
    args.work.mkdir(parents=True, exist_ok=True)
    env = (
        gpu_env.install(args.bundle, Path("/tmp/hsx-gpu-site"), args.work / "install.log")
        if args.device == "cuda"
        else gpu_env.cpu_env()
    )
    model = args.model or prepare_model(env, args.work, args.gpu)
    servers = start_pair(
        model,
        env,
        args.work,
        args.gpu,
        args.port,
        args.capture_writer_threads,
        not args.capture_in_process_writer,
        args.other_writer_side,
    )
    try:
        for s in servers.values():
            wait_healthy(s, 600)
        result = measure(
            servers,
            tuple(args.case or (GPU_CASES if env.cuda else CPU_CASES)),
            args.rounds,
            deadline,
            kept_side=args.kept_side,
            uncaptured_side=args.uncaptured_side,
        )
    finally:
        for s in servers.values():
            s.stop()
    result.update(
        describe(env, model),
        capture_writer_threads=args.capture_writer_threads or "default",
        capture_writer_process=not args.capture_in_process_writer,
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    for c in result["cases"]:
        kept = f", kept until the round ends {c['ratio_kept_of_medians']:.3f}" if "ratio_kept_of_medians" in c else ""
        if "ratio_other_writer_of_medians" in c:
            kept += (
                f"; other writer / plain = {c['ratio_other_writer_of_medians']:.3f}, / capture "
                f"{c['other_writer_over_capture']['of_medians']:.3f}"
            )
        if "ratio_to_uncaptured_of_medians" in c:
            kept += f"; capture / same server uncaptured = {c['ratio_to_uncaptured_of_medians']:.3f}"
        print(
            f"{c['case']}: capture / plain = {c['ratio_of_medians']:.3f}{kept}; scheduler's median gap between "
            f"prefill batches (ms): {c['scheduler_median_gap_ms']}"
        )
    return 0 if result["ok"] else 1


def prepare_model(env: gpu_env.GpuEnv, work: Path, gpu: int = 0) -> Path:
    """The tiny Llama (for its tokenizer, and as the dry run's model) and, on the GPU, the 8B one."""
    from hsextract.tiny_model import ensure_tiny_model

    tiny = ensure_tiny_model("llama", work / "models" / "llama")
    if not env.cuda:
        return tiny
    big = work / "models" / "llama8b"
    if not (big / "hsextract-llama8b.json").is_file():
        subprocess.run(
            [sys.executable, str(REPO / "bench" / "gpu" / "gen_llama8b.py"), str(big), "--tokenizer-from", str(tiny)],
            check=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)},
        )
    return big


def describe(env: gpu_env.GpuEnv, model: Path) -> dict:
    cfg = json.loads((model / "config.json").read_text())
    return {
        "benchmark": "capture_server_gpu",
        "what": "SGLang 0.5.23 prefill-only requests, plain server vs capture server (same flags, same GPU), "
        f"{cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, random bf16 weights",
        "device": env.device,
        "gpus": nvidia_smi_names() if env.cuda else [],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


if __name__ == "__main__":
    sys.exit(main())
