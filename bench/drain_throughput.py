"""Drain throughput versus the disk's own copy speed, measured side by side in alternating rounds.

Stages a few GB of dumps in /dev/shm (synthetic rows through the staging contract, sized like a
Llama-8B capture: hidden 4096, 3 aux layers + final, 256-2048 tokens per sample, half of each
sample loss-masked), then for each format runs rounds of

    cp -r + sync, drain with the draft vocabulary counted, cp -r + sync, drain without it

(the two drains swap places every other round), each drain on a fresh copy of the staged bytes
into an empty output directory with the real daemon (durable: fsync per file, rename, directory
fsync, manifest fsync; finalize included), timed from the drain up (its worker processes too) to its
last commit. On a shared disk one pass is noise, so every drain is
compared with the cp + sync next to it, and the median of those ratios over the rounds is
reported with its spread (min-max). The counting's cost is the median, over rounds, of the drain
with counting over the drain without in the same round. The disk's ceiling for the drain's write
pattern (`hsextract.ops.disk_ceiling`: 1 to 16 writers, files of the staged samples' sizes, fsync,
rename, directory fsync) is measured in the same call, before and after the rounds (the better of
the two), and every format's drain rate is also given over it (``drain_over_ceiling``), with where
the set was written (``output_root``). Saves bench/results/drain_throughput.json; the LAST line is
the speculators ratio with counting.

    python bench/drain_throughput.py [--gb 2] [--rounds 5] [--out-dir .work/bench-drain] [--workers N]
    python bench/drain_throughput.py --hidden 64 --tokens 100,330 --gb 0.15 --formats specforge --json X
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "bench")]

import torch  # noqa: E402
from common import on_disk_keys  # noqa: E402
from hsextract import fingerprint  # noqa: E402
from hsextract.drain import prepare as drain_prepare  # noqa: E402
from hsextract.drain.core import DrainConfig, Drainer  # noqa: E402
from hsextract.formats import FORMATS as REGISTRY  # noqa: E402
from hsextract.ops.disk_ceiling import DiskCeiling, measure  # noqa: E402
from hsextract.output.committer import Committer  # noqa: E402
from hsextract.output.layout import client_summary_path  # noqa: E402
from hsextract.output.run_id import load_or_create_run_id  # noqa: E402
from hsextract.staging.dumps import DoneMarker, StateFileLayout, write_done_marker  # noqa: E402
from hsextract.staging.records import SampleRecord, make_rid, write_record  # noqa: E402
from hsextract.vocab import counts as counts_mod  # noqa: E402
from hsextract.vocab.tracker import VocabTracker  # noqa: E402

logging.disable(logging.WARNING)

FORMATS = ("specforge", "speculators-v1", "modelopt", "speculators")  # speculators last: its ratio is the last line
HIDDEN, NUM_AUX = 4096, 3
TOKENS = (256, 2048)  # a sample's length, drawn uniformly (--tokens)
VOCAB = 128256  # Llama 3's vocabulary: the t2d files' length


def stage(dump: Path, run_id: str, total_bytes: int, seed: int = 0) -> tuple[int, int]:
    """Stage dumps until `total_bytes`; return (samples, bytes of states files)."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    # One pool of realistic-looking bf16 rows, sliced per sample (generating GBs of randn is slow).
    pool = (torch.randn(2048, NUM_AUX + 1, HIDDEN, generator=g) * 0.5).bfloat16()
    n = size = 0
    while size < total_bytes:
        t = rng.randint(*TOKENS)
        rid = make_rid("hsx", run_id, n)
        # Token ids as text has them: Zipf-like, a few thousand distinct ids in a GB.
        ids = [min(int(rng.paretovariate(1.1)) - 1, VOCAB - 1) * 7 % VOCAB for _ in range(t)]
        mask = [0] * (t // 2) + [1] * (t - t // 2)  # the prompt half is not trained on
        write_record(dump, SampleRecord(rid=rid, index=n, input_ids=ids, loss_mask=mask, run_id=run_id))
        layout = StateFileLayout(prompt_len=t, num_slots=NUM_AUX + 1, hidden_size=HIDDEN)
        d = dump / rid
        d.mkdir(parents=True)
        with open(d / "states.safetensors", "wb") as f:
            f.write(layout.header)
            f.write(pool[:t].contiguous().view(torch.uint8).numpy().tobytes())
            f.write(torch.tensor(ids, dtype=torch.int64).numpy().tobytes())
        write_done_marker(
            dump,
            DoneMarker(
                rid=rid,
                prompt_len=t,
                num_aux=NUM_AUX,
                hidden_size=HIDDEN,
                dtype="bfloat16",
                eagle_aux_hidden_state_layer_ids=[1, 15, 27],
                sglang_layers_to_capture=[2, 16, 28],
                num_hidden_layers=32,
                final_hidden="pre_norm",
                architecture="LlamaForCausalLM",
                chunks=[[0, t]],
                sglang_version="0.5.23",
                fingerprint=fingerprint.of_states(pool[:t], torch.tensor(ids, dtype=torch.int64)),
            ),
        )
        size += layout.file_size
        n += 1
    return n, size


def drop_caches() -> None:
    """Start both contenders with no dirty pages (the page cache is shared: it is not dropped)."""
    subprocess.run(["sync"], check=True)


def cp_sync(src: Path, dst: Path) -> float:
    drop_caches()
    t0 = time.perf_counter()
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - t0


class CountingTime:
    """Seconds spent in the draft vocabulary's code during one drain: per-sample counts (in the
    workers, in parallel), adding them at commit, and writing the checkpoint and the files."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parts = {"workers": 0.0, "commit": 0.0, "files": 0.0}

    def wrap(self, part: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self.lock:
                    self.parts[part] += time.perf_counter() - t0

        return timed

    def install(self) -> None:
        drain_prepare.masked_counts = self.wrap("workers", counts_mod.masked_counts)
        VocabTracker.add = self.wrap("commit", _ORIGINAL["add"])
        VocabTracker.write_files = self.wrap("files", _ORIGINAL["write_files"])


_ORIGINAL = {"add": VocabTracker.add, "write_files": VocabTracker.write_files}


class CommitClock:
    """When the drain's committer started (the drain is up, its worker processes too) and when its
    last commit ended (the samples are drained; finalize follows), timed for the length of one run."""

    def __init__(self) -> None:
        self.started = self.last = 0.0
        self._original, self._start = Committer._commit, Committer.start

    def __enter__(self) -> CommitClock:
        original, start = self._original, self._start

        def timed(committer: Committer, batch: list) -> None:
            original(committer, batch)
            self.last = time.perf_counter()

        def started(committer: Committer) -> None:
            self.started = time.perf_counter()
            start(committer)

        Committer._commit = timed  # type: ignore[method-assign]
        Committer.start = started  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Committer._commit, Committer.start = self._original, self._start  # type: ignore[method-assign]


def drain(
    fmt: str,
    dump: Path,
    out: Path,
    workers: int | None,
    count_vocab: bool,
    timing: CountingTime | None = None,
    worker_mode: str = "auto",
) -> tuple[float, float, float]:
    """(seconds from the drain up to its last commit, seconds of the whole run from its launch including
    finalize, CPU seconds of the run).

    "Up" includes the worker processes where the drain has them (16 cores: by default): a daemon is
    up before its client, and rounds shorter than the processes' start measured the drain's threads
    beside their imports (the GPU host's 2026-12-05 figures). The start is drain_start.py's and
    drain_ab.py's to measure.

    The CPU seconds (user + system, every thread of this process) are what other tenants of a
    shared machine disturb least: the wall time of a pass varies by a third from one pass to the
    next, its CPU time by a few percent."""
    drop_caches()
    cfg = DrainConfig(
        dump_dir=dump,
        output=out,
        format=fmt,
        exit_when_done=True,
        finalize_idle_s=3600,
        status_interval_s=1.0,
        count_vocab=count_vocab,
        vocab_size=VOCAB,
        worker_mode=worker_mode,
        wait_for_worker_processes=True,
    )
    if workers:
        cfg.workers = workers
    d = Drainer(cfg)
    if timing is not None:
        timing.install()
    with CommitClock() as clock:
        t0, c0 = time.perf_counter(), time.process_time()
        code = d.run()
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    if code != 0:
        raise SystemExit(f"{fmt}: the drain exited {code}: the run's counts do not add up (see its log)")
    if not clock.last:
        raise SystemExit(f"{fmt}: no commit was seen (the committer's hook moved?)")
    committed = clock.last - clock.started
    if d.stats.samples_total == 0 or any(p.name.startswith("hsx-") for p in dump.iterdir()):
        raise SystemExit(f"{fmt}: the drain left dumps behind")
    if count_vocab != (out / "draft_vocab.json").exists():
        raise SystemExit(f"{fmt}: draft vocabulary files {'missing' if count_vocab else 'written'}")
    return committed, dt, cpu


def stage_master(master: Path, total_bytes: int) -> tuple[int, int]:
    """A run's staged dumps in ``master/dump`` (its run id in ``master/run``) and the client's summary of
    a finished run over exactly those samples (the drain's end-of-run check); (samples, bytes)."""
    (master / "run").mkdir(parents=True, exist_ok=True)
    samples, nbytes = stage(master / "dump", load_or_create_run_id(master / "run"), total_bytes)
    (master / "client-summary.json").write_text(json.dumps({"dataset_lines": samples, "shard": [0, 1]}))
    return samples, nbytes


def one_drain(
    fmt: str,
    master: Path,
    shm: Path,
    base: Path,
    workers: int | None,
    count_vocab: bool,
    timing: CountingTime | None = None,
    worker_mode: str = "auto",
) -> tuple[float, float, float, int]:
    """Drain a fresh copy of the staged dumps into an empty directory; (seconds to the last commit,
    seconds of the whole run, CPU seconds, bytes written)."""
    out = base / fmt
    out.mkdir()
    shutil.copy(master / "run" / "run.json", out / "run.json")  # same run id as the staged rids
    # The client's summary of a finished run over exactly the staged samples: the drain's end-of-run
    # check then proves that every one of them landed in the set.
    (out / ".hsextract").mkdir(parents=True, exist_ok=True)
    shutil.copy(master / "client-summary.json", client_summary_path(out))
    work = shm / "work"
    shutil.copytree(master / "dump", work)
    if REGISTRY[fmt].final_hidden == "post_norm":  # SpecForge and ModelOpt take the final hidden state post-norm
        for marker in work.glob("*/done.json"):
            marker.write_text(marker.read_text().replace('"pre_norm"', '"post_norm"'))
    try:
        committed, whole, cpu = drain(fmt, work, out, workers, count_vocab, timing, worker_mode)
        written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    return committed, whole, cpu, written


def staged_sizes(dump: Path, n: int = 8) -> list[int]:
    """`n` sizes spread over the staged states files' (their quantiles): the ceiling's file sizes."""
    sizes = sorted(p.stat().st_size for p in dump.glob("*/states.safetensors"))
    return sorted({sizes[min(len(sizes) - 1, (2 * k + 1) * len(sizes) // (2 * n))] for k in range(n)})


def ceiling_of(base: Path, sizes: list[int], seconds: float) -> DiskCeiling:
    c = measure(base / "ceiling", sizes, seconds_per_point=seconds)
    print(f"disk ceiling: {c.summary()}", flush=True)
    return c


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def bench_format(fmt: str, master: Path, shm: Path, base: Path, nbytes: int, rounds: int, workers: int | None) -> dict:
    """Alternating rounds of cp + sync and drains with and without the vocabulary; the ratios' medians."""
    runs: dict[str, list[float]] = {
        "cp_on": [],
        "on": [],
        "cp_off": [],
        "off": [],
        "samples_on": [],
        "samples_off": [],
        "cpu_s_on": [],
        "cpu_s_off": [],
    }
    counting: list[dict] = []
    written = 0
    for r in range(rounds):
        for vocab in (True, False) if r % 2 == 0 else (False, True):
            key = "on" if vocab else "off"
            t_cp = cp_sync(master / "dump", base / "cp")
            shutil.rmtree(base / "cp")
            timing = CountingTime() if vocab else None
            t_samples, t_drain, cpu, written = one_drain(fmt, master, shm, base, workers, vocab, timing)
            runs[f"cpu_s_{key}"].append(cpu)
            if timing is not None:
                counting.append({"drain_s": t_drain, **timing.parts})
            runs[f"cp_{key}"].append(nbytes / t_cp / 1e6)
            runs[key].append(nbytes / t_drain / 1e6)
            runs[f"samples_{key}"].append(nbytes / t_samples / 1e6)
            print(
                f"  {fmt} round {r} counting {key:3s}: drain {runs[key][-1]:7.1f} MB/s, "
                f"cp+sync {runs[f'cp_{key}'][-1]:7.1f} MB/s, ratio {runs[key][-1] / runs[f'cp_{key}'][-1]:.3f}",
                flush=True,
            )
    ratio_on = [d / c for d, c in zip(runs["on"], runs["cp_on"], strict=True)]
    ratio_off = [d / c for d, c in zip(runs["off"], runs["cp_off"], strict=True)]
    on_over_off = [a / b for a, b in zip(runs["on"], runs["off"], strict=True)]
    samples_on = [d / c for d, c in zip(runs["samples_on"], runs["cp_on"], strict=True)]
    samples_off = [d / c for d, c in zip(runs["samples_off"], runs["cp_off"], strict=True)]
    return {
        "written_bytes": written,
        "ratio": spread(ratio_on),  # drain (counting, the default) / cp + sync beside it
        "ratio_without_counting": spread(ratio_off),
        "counting_over_not_counting": spread(on_over_off),  # same round, drain with / without counting
        "ratio_with_over_without": round(statistics.median(ratio_on) / statistics.median(ratio_off), 3),
        # The same up to the last commit: the samples' own throughput, without the one-off finalize
        # (Arrow dataset, sample_lengths.json, the vocabulary files) that follows it.
        "samples_ratio": spread(samples_on),
        "samples_ratio_without_counting": spread(samples_off),
        "samples_ratio_with_over_without": round(statistics.median(samples_on) / statistics.median(samples_off), 3),
        "drain_mb_per_s": spread(runs["on"]),
        "drain_without_counting_mb_per_s": spread(runs["off"]),
        "cp_sync_mb_per_s": spread(runs["cp_on"] + runs["cp_off"]),
        # CPU seconds of the drain without counting over with it, same round: the throughput ratio a
        # drain bound by its CPU (the torch formats on 2 cores) would show, with little of the noise.
        "cpu_without_over_with": spread([b / a for a, b in zip(runs["cpu_s_on"], runs["cpu_s_off"], strict=True)]),
        "cpu_s": {"with": spread(runs["cpu_s_on"]), "without": spread(runs["cpu_s_off"])},
        "rounds_mb_per_s": {k: [round(v, 1) for v in vals] for k, vals in runs.items() if not k.startswith("cpu")},
        # Seconds inside the vocabulary code per drain with counting (workers' share is CPU time spread
        # over the workers; commit and files are on the committer's and the main thread's path).
        "counting_s": {part: spread([c[part] for c in counting]) for part in ("workers", "commit", "files")},
        "counting_share_of_drain": spread(
            [
                (c["commit"] + c["files"] + c["workers"] / max(1, workers or DrainConfig.workers)) / c["drain_s"]
                for c in counting
            ]
        ),
    }


def main() -> int:
    global HIDDEN, TOKENS  # the staged samples' shape (--hidden, --tokens)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.0, help="GB of dumps to stage in /dev/shm (default 2)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per format (default 5)")
    ap.add_argument("--out-dir", default=str(REPO / ".work" / "bench-drain"), help="directory on the disk to test")
    ap.add_argument("--workers", type=int, default=None, help="drain workers (default: the daemon's default)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated subset of " + ",".join(FORMATS))
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "drain_throughput.json"))
    ap.add_argument(
        "--hidden",
        type=int,
        default=HIDDEN,
        help="hidden size (default 4096; 64 with --tokens 100,330 is the tiny model's sample, where "
        "the drain's cost per file, not the bytes, is what counts)",
    )
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="sample length range, min,max")
    ap.add_argument(
        "--ceiling-seconds",
        type=float,
        default=4.0,
        help="seconds per writer count of the disk's ceiling, measured before and after the rounds",
    )
    a = ap.parse_args()
    HIDDEN = a.hidden
    TOKENS = tuple(int(x) for x in a.tokens.split(","))
    if "speculators" in a.formats.split(","):
        import datasets  # noqa: F401  (process start-up, like torch: the daemon imports it once, before draining)

    shm = Path(tempfile.mkdtemp(prefix="hsx-bench-", dir="/dev/shm"))
    base = Path(a.out_dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    results = {}
    ceilings: list[DiskCeiling] = []
    try:
        master = shm / "master"
        t0 = time.perf_counter()
        samples, nbytes = stage_master(master, int(a.gb * 1e9))
        print(f"staged {samples} samples, {nbytes / 1e9:.2f} GB in /dev/shm ({time.perf_counter() - t0:.0f} s)")
        sizes = staged_sizes(master / "dump")
        ceilings.append(ceiling_of(base, sizes, a.ceiling_seconds))
        for fmt in [f for f in FORMATS if f in a.formats.split(",")]:
            r = bench_format(fmt, master, shm, base, nbytes, a.rounds, a.workers)
            results[fmt] = {"samples": samples, "staged_bytes": nbytes, **r}
        ceilings.append(ceiling_of(base, sizes, a.ceiling_seconds))
        ceiling = max(c.gb_per_s for c in ceilings)
        for fmt, r in results.items():
            r["drain_gb_per_s"] = round(r["drain_mb_per_s"]["median"] / 1e3, 3)
            r["drain_over_ceiling"] = spread([v / 1e3 / ceiling for v in r["rounds_mb_per_s"]["on"]])
            same_round, cpu = r["counting_over_not_counting"]["median"], r["cpu_without_over_with"]
            print(
                f"{fmt}: ratio {r['ratio']['median']:.3f} ({r['ratio']['min']:.3f}-{r['ratio']['max']:.3f}); "
                f"without counting {r['ratio_without_counting']['median']:.3f}; with / without "
                f"{r['ratio_with_over_without']:.3f} (same-round drains {same_round:.3f}); to the last commit "
                f"{r['samples_ratio']['median']:.3f} vs {r['samples_ratio_without_counting']['median']:.3f} = "
                f"{r['samples_ratio_with_over_without']:.3f}; CPU without / with {cpu['median']:.3f} "
                f"({cpu['min']:.3f}-{cpu['max']:.3f}); counting took "
                f"{100 * r['counting_share_of_drain']['median']:.2f} % of the drain; drain / disk ceiling "
                f"{r['drain_over_ceiling']['median']:.3f} (ceiling {ceiling:.2f} GB/s)",
                flush=True,
            )
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
    last = results["speculators"] if "speculators" in results else next(iter(results.values()))
    report = {
        "what": "staged /dev/shm dumps -> durable training set on the repo's disk, vs cp -r + sync of the same bytes; "
        "alternating rounds, medians with min-max; drains with and without the draft vocabulary counted",
        # The drain alone: no pipeline ran, so whole_pipeline_on_disk_over_ceiling is null.
        **on_disk_keys(str(base), ceiling, last["drain_gb_per_s"]),
        "disk_ceiling": [c.as_dict() for c in ceilings],
        "hidden_size": HIDDEN,
        "num_aux": NUM_AUX,
        "vocab_size": VOCAB,
        "rounds": a.rounds,
        "workers": a.workers or DrainConfig.workers,
        "cpus": os.cpu_count(),
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        "formats": results,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    name = "speculators" if "speculators" in results else next(iter(results))
    r = results[name]
    print(
        f"{name}: with counting / without: {r['ratio_with_over_without']:.3f} (whole run), "
        f"{r['samples_ratio_with_over_without']:.3f} (to the last commit), "
        f"{r['cpu_without_over_with']['median']:.3f} (CPU seconds)"
    )
    print(
        f"{name} drain vs cp+sync: median ratio {r['ratio']['median']:.3f} "
        f"({r['ratio']['min']:.3f}-{r['ratio']['max']:.3f} over {a.rounds} rounds)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
