"""Drain throughput versus the disk's own copy speed, measured side by side in one run.

Stages a few GB of dumps in /dev/shm (synthetic rows through the staging contract, sized like a
Llama-8B capture: hidden 4096, 3 aux layers + final, 256-2048 tokens per sample), then for each
format: copies the same staged bytes to the output disk with ``cp`` + ``sync`` and drains them
with the real daemon (durable: fsync per file, rename, directory fsync, manifest fsync). Prints
MB/s of each and their ratio; the LAST line is the speculators ratio. Saves
bench/results/drain_throughput.json.

    python bench/drain_throughput.py [--gb 2] [--out-dir .work/bench-drain] [--workers 4]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "files" / "python"))

import datasets  # noqa: E402, F401  (process start-up, like torch: the daemon imports it once, before draining)
import torch  # noqa: E402
from hsextract.drain.core import DrainConfig, Drainer  # noqa: E402
from hsextract.records import SampleRecord, load_or_create_run_id, make_rid, write_record  # noqa: E402
from hsextract.staging import DoneMarker, StateFileLayout, write_done_marker  # noqa: E402

logging.disable(logging.WARNING)

FORMATS = ("specforge", "speculators-v1", "speculators")  # speculators last: its ratio is the last line
HIDDEN, NUM_AUX = 4096, 3


def stage(dump: Path, run_id: str, total_bytes: int, seed: int = 0) -> tuple[int, int]:
    """Stage dumps until `total_bytes`; return (samples, bytes of states files)."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    # One pool of realistic-looking bf16 rows, sliced per sample (generating GBs of randn is slow).
    pool = (torch.randn(2048, NUM_AUX + 1, HIDDEN, generator=g) * 0.5).bfloat16()
    n = size = 0
    while size < total_bytes:
        t = rng.randint(256, 2048)
        rid = make_rid("hsx", run_id, n)
        ids = [rng.randrange(0, 128000) for _ in range(t)]
        write_record(dump, SampleRecord(rid=rid, index=n, input_ids=ids, loss_mask=[1] * t, run_id=run_id))
        layout = StateFileLayout(prompt_len=t, num_slots=NUM_AUX + 1, hidden_size=HIDDEN)
        d = dump / rid
        d.mkdir(parents=True)
        with open(d / "states.safetensors", "wb") as f:
            f.write(layout.header)
            f.write(pool[:t].contiguous().view(torch.uint8).numpy().tobytes())
            f.write(torch.tensor(ids, dtype=torch.int64).numpy().tobytes())
        write_done_marker(dump, DoneMarker(
            rid=rid, prompt_len=t, num_aux=NUM_AUX, hidden_size=HIDDEN, dtype="bfloat16",
            eagle_aux_hidden_state_layer_ids=[1, 15, 27], sglang_layers_to_capture=[2, 16, 28],
            num_hidden_layers=32, final_hidden="pre_norm", architecture="LlamaForCausalLM",
            chunks=[[0, t]], sglang_version="0.5.23",
        ))
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


def drain(fmt: str, dump: Path, out: Path, workers: int | None) -> float:
    drop_caches()
    (out / ".hsextract").mkdir(parents=True, exist_ok=True)
    (out / ".hsextract" / "client-summary.json").write_text("{}")
    cfg = DrainConfig(dump_dir=dump, output=out, format=fmt,
                      exit_when_done=True, finalize_idle_s=3600, status_interval_s=1.0)
    if workers:
        cfg.workers = workers
    d = Drainer(cfg)
    t0 = time.perf_counter()
    d.run()
    dt = time.perf_counter() - t0
    if d.stats.samples_total == 0 or any(p.name.startswith("hsx-") for p in dump.iterdir()):
        raise SystemExit(f"{fmt}: the drain left dumps behind")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.0, help="GB of dumps to stage in /dev/shm (default 2)")
    ap.add_argument("--out-dir", default=str(REPO / ".work" / "bench-drain"), help="directory on the disk to test")
    ap.add_argument("--workers", type=int, default=None, help="drain workers (default: the daemon's default)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated subset of " + ",".join(FORMATS))
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "drain_throughput.json"))
    a = ap.parse_args()

    shm = Path(tempfile.mkdtemp(prefix="hsx-bench-", dir="/dev/shm"))
    base = Path(a.out_dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    results = {}
    try:
        master = shm / "master"
        t0 = time.perf_counter()
        samples, nbytes = stage(master / "dump", load_or_create_run_id(master / "run"), int(a.gb * 1e9))
        print(f"staged {samples} samples, {nbytes / 1e9:.2f} GB in /dev/shm ({time.perf_counter() - t0:.0f} s)")
        for fmt in [f for f in FORMATS if f in a.formats.split(",")]:
            # cp + sync of exactly the staged bytes, then the drain of a fresh copy of them.
            t_cp = cp_sync(master / "dump", base / "cp")
            shutil.rmtree(base / "cp")
            out = base / fmt
            out.mkdir()
            shutil.copy(master / "run" / "run.json", out / "run.json")  # same run id as the staged rids
            work = shm / "work"
            shutil.copytree(master / "dump", work)
            if fmt == "specforge":  # SpecForge takes the final hidden state post-norm
                for marker in work.glob("*/done.json"):
                    marker.write_text(marker.read_text().replace('"pre_norm"', '"post_norm"'))
            t_drain = drain(fmt, work, out, a.workers)
            shutil.rmtree(work, ignore_errors=True)
            written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
            shutil.rmtree(out)
            cp_mbs, drain_mbs = nbytes / t_cp / 1e6, nbytes / t_drain / 1e6
            results[fmt] = {
                "samples": samples, "staged_bytes": nbytes, "written_bytes": written,
                "drain_s": round(t_drain, 3), "cp_sync_s": round(t_cp, 3),
                "drain_mb_per_s": round(drain_mbs, 1), "cp_sync_mb_per_s": round(cp_mbs, 1),
                "ratio": round(drain_mbs / cp_mbs, 3),
            }
            print(f"{fmt}: drain {drain_mbs:.1f} MB/s, cp+sync {cp_mbs:.1f} MB/s, ratio {drain_mbs / cp_mbs:.2f}")
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
    report = {
        "what": "staged /dev/shm dumps -> durable training set on the repo's disk, vs cp -r + sync of the same bytes",
        "hidden_size": HIDDEN, "num_aux": NUM_AUX, "workers": a.workers or DrainConfig.workers, "cpus": os.cpu_count(),
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        "formats": results,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    r = results.get("speculators") or next(iter(results.values()))
    print(f"speculators drain {r['drain_mb_per_s']} MB/s vs cp+sync {r['cp_sync_mb_per_s']} MB/s: "
          f"ratio {r['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
