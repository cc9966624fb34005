"""The GPU test tier in one invocation, without pytest: capture checks (1 and 2 GPUs) and the
server-level overhead bench, within a time budget, results as JSON.

    python3 bench/gpu/run_all.py --bundle .gpu [--budget-s 540]      # on the H200 machine
    python3 bench/gpu/run_all.py --device cpu                         # dry run of the scripts on a CPU

What runs (all at once where it can, so the servers' start-up times overlap):

1. the bundle's wheels are installed (``bench/gpu/gpu_env.py``) and the tiny models generated;
   the 8B-shaped bench model is generated on the last GPU meanwhile, and the bench's two servers
   start on that GPU as soon as it is written;
2. the capture checks (``bench/gpu/capture_checks.py``): tiny Llama and DeepSeek-V3 at TP 1, and
   with two GPUs at TP 2 and DeepSeek at TP 2 with DP attention 2, all servers at once;
3. once the checks' servers are gone, the overhead bench (``bench/capture_server_gpu.py``) in the
   time left: at least 3 alternating rounds per side and case, fewer requests per round if needed.

Writes ``capture_gpu.json`` and ``capture_server_gpu.json`` into ``--results`` (the repository's
``bench/results`` on a GPU; the work directory for a dry run). Where ``$OUT`` is set (the device
tool), each result is also written there as soon as it exists, the run's log goes there as it
grows, and ``logs.tar.gz`` (every server log) at the end, so a run cut short still brings back
what it had. Exits 0 only if every check passed and every capture round staged exactly its
requests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO / "bench"), str(REPO / "files" / "python"), str(REPO / "tests")]

import capture_checks  # noqa: E402
import capture_server_gpu as bench  # noqa: E402
import gpu_env  # noqa: E402
from gpu_server import ServerStartError, wait_healthy  # noqa: E402

SITE = Path("/tmp/hsx-gpu-site")
BENCH_RESERVE_S = 200  # warm-ups and 3 + 3 rounds of both cases, at the 8B model's speed on an H200
BENCH_PORT = 30300


class Log:
    """Timestamped lines to stdout and to the run's log file."""

    def __init__(self, path: Path):
        self.path, self.t0, self._lock = path, time.monotonic(), threading.Lock()

    def __call__(self, message: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {message}"
        with self._lock:
            print(line, flush=True)
            with open(self.path, "a") as f:
                f.write(line + "\n")


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def make_tiny_models(kinds: set[str], root: Path) -> dict[str, Path]:
    """Each kind's tiny model under ``root`` (generated in parallel subprocesses, as once per machine)."""
    env = {**os.environ, "PYTHONPATH": str(gpu_env.PACKAGE_DIR)}
    procs = {
        k: subprocess.Popen(
            [sys.executable, "-m", "hsextract", "make-tiny-model", "--kind", k, str(root / k)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in kinds
    }
    for kind, proc in procs.items():
        _, err = proc.communicate(timeout=600)
        if proc.returncode:
            raise RuntimeError(f"make-tiny-model --kind {kind} failed:\n{err[-2000:]}")
    return {k: root / k for k in kinds}


def machine(env: gpu_env.GpuEnv) -> dict:
    shm = shutil.disk_usage("/dev/shm")
    info = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "gpus": bench.nvidia_smi_names(),
        "dev_shm_gib": {"size": round(shm.total / 2**30, 1), "free": round(shm.free / 2**30, 1)},
    }
    probe = (
        "import json, torch, triton, transformers, sglang; print(json.dumps({'torch': torch.__version__, "
        "'triton': triton.__version__, 'transformers': transformers.__version__, 'sglang': sglang.__version__}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env.server_env(), capture_output=True, text=True, timeout=300
    )
    if done.returncode == 0:
        info.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument(
        "--bundle",
        type=Path,
        default=REPO / ".gpu",
        help="the bundle of bench/gpu/build_bundle.py (default: .gpu in the repository)",
    )
    ap.add_argument("--budget-s", type=float, default=540, help="the whole run, from start to the last JSON")
    ap.add_argument("--work", type=Path, default=Path("/tmp/hsx-gpu-tier"))
    ap.add_argument("--results", type=Path, help="where the JSON results go (default: bench/results on a GPU)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per side and case of the bench")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--checks", help="comma-separated names of the capture checks to run (default: all of them)")
    args = ap.parse_args()
    deadline = time.monotonic() + args.budget_s
    args.work.mkdir(parents=True, exist_ok=True)
    results_dir = args.results or (REPO / "bench" / "results" if args.device == "cuda" else args.work / "results")
    results_dir.mkdir(parents=True, exist_ok=True)
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    say = Log((out or args.work) / "run_all.log")
    save = Saver(results_dir, out)
    ok = False
    try:
        ok = run(args, deadline, save, say)
    except Exception as exc:
        say(f"FAILED: {type(exc).__name__}: {exc}")
        raise
    finally:
        if out:
            pack_logs(args.work, out)
    say(f"{'ALL PASSED' if ok else 'SOME CHECKS FAILED'}; results in {', '.join(map(str, save.dirs))}")
    return 0 if ok else 1


class Saver:
    """Writes a JSON result into the results directory and, where set, into the device's $OUT."""

    def __init__(self, results_dir: Path, out: Path | None):
        self.dirs = [d for d in (results_dir, out) if d]

    def __call__(self, name: str, data: dict) -> None:
        for d in self.dirs:
            (d / name).write_text(json.dumps(data, indent=2) + "\n")


def run(args: argparse.Namespace, deadline: float, save: Saver, say: Log) -> bool:
    cuda = args.device == "cuda"
    if cuda:
        env = gpu_env.install(args.bundle, SITE, args.work / "install.log")
        gpus = gpu_count()
        configs = capture_checks.gpu_configs(gpus)
    else:
        env, gpus, configs = gpu_env.cpu_env(), 0, capture_checks.cpu_configs()
    if args.checks:
        wanted = set(args.checks.split(","))
        unknown = wanted - {c.name for c in configs}
        if unknown:
            raise SystemExit(f"--checks: unknown {sorted(unknown)}; this machine has {[c.name for c in configs]}")
        configs = [c for c in configs if c.name in wanted]
        missing = {c.reference for c in configs if c.reference} - wanted
        if missing:
            raise SystemExit(f"--checks: {sorted(missing)} must run too: the others are compared with it")
    say(f"environment ready: {env.device}, {gpus} GPU(s); checks: {[c.name for c in configs]}")
    with ThreadPoolExecutor(max_workers=1) as pool:
        machine_info = pool.submit(machine, env)
        models = make_tiny_models({c.kind for c in configs} | {"llama"}, args.work / "models")
        say("tiny models ready")
        bench_start = None if args.skip_bench else BenchStart(env, models["llama"], args.work, max(gpus - 1, 0), say)
        # The checks may take all but what the bench needs: a hung server must not eat the bench's time.
        checks = guarded(
            lambda: capture_checks.run_checks(
                configs, models, env, args.work, deadline - (0 if args.skip_bench else BENCH_RESERVE_S)
            )
        )
        checks.update(
            benchmark="capture_gpu",
            machine=machine_info.result(),
            measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )
    save("capture_gpu.json", checks)
    report_checks(checks, say)
    if bench_start is None:
        return checks["ok"]
    overhead = guarded(lambda: bench_start.measure(args.rounds, deadline))
    save("capture_server_gpu.json", overhead)
    report_bench(overhead, say)
    return checks["ok"] and overhead["ok"]


def guarded(step) -> dict:
    """A step's JSON result, or ``{"ok": False, "error": ...}`` if it raised: one failed step does
    not take the other's results with it."""
    try:
        return step()
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}


class BenchStart:
    """The overhead bench's servers, started beside the checks: generate the 8B-shaped model on the
    bench GPU (on a CPU, the tiny Llama serves), then start the plain and the capture server."""

    def __init__(self, env: gpu_env.GpuEnv, tiny_llama: Path, work: Path, gpu: int, say: Log):
        self.env, self.work, self.gpu, self.say = env, work, gpu, say
        self.model, self.servers, self.error = tiny_llama, {}, ""
        self._thread = threading.Thread(target=self._start, name="bench-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            if self.env.cuda:
                t0 = time.monotonic()
                self.model = bench.prepare_model(self.env, self.work, self.gpu)
                self.say(f"8B-shaped model ready in {time.monotonic() - t0:.0f} s")
            self.servers = bench.start_pair(self.model, self.env, self.work, self.gpu, BENCH_PORT)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def measure(self, rounds: int, deadline: float) -> dict:
        """Wait for both servers (starting them once more if a start failed and time allows), then
        run the bench until ``deadline``; the servers are stopped in any case."""
        self._thread.join()
        if self.error:
            raise RuntimeError(f"the bench's servers could not be started: {self.error}")
        try:
            try:
                self._wait(deadline)
            except ServerStartError as exc:
                self.say(f"a bench server failed to start ({str(exc)[:300]}); starting both again")
                self._stop()
                if deadline - time.monotonic() < BENCH_RESERVE_S:
                    raise
                self.servers = bench.start_pair(self.model, self.env, self.work, self.gpu, BENCH_PORT)
                self._wait(deadline)
            self.say(f"bench servers healthy; {deadline - time.monotonic():.0f} s left for the bench")
            result = bench.measure(
                self.servers, bench.GPU_CASES if self.env.cuda else bench.CPU_CASES, rounds, deadline - 20, self.say
            )
        finally:
            self._stop()
        result.update(bench.describe(self.env, self.model))
        return result

    def _wait(self, deadline: float) -> None:
        for handle in self.servers.values():
            wait_healthy(handle, max(60.0, deadline - time.monotonic() - 120))

    def _stop(self) -> None:
        with ThreadPoolExecutor() as pool:
            list(pool.map(lambda h: h.stop(), self.servers.values()))


def report_checks(checks: dict, say: Log) -> None:
    if "error" in checks:
        say(f"checks FAILED: {checks['error']}")
    for c in checks.get("configs", []):
        say(
            f"check {c['name']}: {'ok' if c['ok'] else 'FAILED'}; {c['complete_dumps']}/{c['requests']} dumps, "
            f"{c['failure_markers']} failure markers, max rel. err {c['max_rel_err']:.4f}, selfcheck "
            f"{c['selfcheck_passed']} (logprobs of {c.get('logprob_compared', 0)}: worst mean abs error "
            f"{c.get('logprob_worst_mean_abs_error', 0):.4g}; wrong rows failed "
            f"{sum(w['failed'] for w in c.get('logprob_wrong_rows', []))} of {len(c.get('logprob_wrong_rows', []))}, "
            f"least error {min((w['mean_abs_error'] or 0 for w in c.get('logprob_wrong_rows', [])), default=0):.4g}), "
            f"decode graphs {c['decode_graphs']}; "
            f"problems: {c['problems'][:5]}"
        )
    for c in checks.get("comparisons", []):
        say(
            f"compare {c['config']} vs {c['reference']}: {'ok' if c['ok'] else 'FAILED'}, max rel. err "
            f"{c['max_rel_err']}, same greedy token {c['same_greedy_token']}/{c['prompts']}; {c['problems'][:3]}"
        )


def report_bench(overhead: dict, say: Log) -> None:
    if "error" in overhead:
        say(f"bench FAILED: {overhead['error']}")
    for c in overhead.get("cases", []):
        say(
            f"bench {c['case']}: plain {c['plain_tokens_per_s']['median']} tok/s, capture "
            f"{c['capture_tokens_per_s']['median']} tok/s, ratio {c['ratio_of_medians']} (pairs "
            f"{c['ratio_per_round_pair']['min']}-{c['ratio_per_round_pair']['max']}), staged "
            f"{c['staged_gb_per_s_median']} GB/s, dumps == requests: {c['complete_dumps_equal_requests']}"
        )


def pack_logs(work: Path, out: Path) -> None:
    """Every server and install log of the run into ``out/logs.tar.gz`` (at most 8 files come back)."""
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        for log in sorted(work.rglob("*.log")):
            tar.add(log, arcname=str(log.relative_to(work)))


if __name__ == "__main__":
    sys.exit(main())
