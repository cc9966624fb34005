"""One drain worker's CPU seconds per GB, split by step: where the drain's time goes, byte by byte.

Stages synthetic dumps in /dev/shm (as bench/drain_throughput.py does: hidden 4096, 3 aux layers +
final, 256-2048 tokens), then for each format has one thread prepare every dump (read, check,
convert, serialize, hash, write, fsync: hsextract.drain.prepare, the worker's whole job) into a
temporary directory on the disk, under cProfile with a CPU clock (``time.thread_time``), once per
round. Each function's own time (cProfile's tottime) is put into one step by where it lives
(`_STEPS`); the figures are the CPU seconds of each step per GB of samples written, the median over
the rounds; the CPU time of the process's other threads (the writer threads of direct writes,
hsextract.direct_write) is added as ``write (other threads)``. Run it with ``--package`` another
checkout's ``files/python`` to profile that version on the same dumps (it must have `prepare` of
the same signature): each pass runs in a child process whose ``PYTHONPATH`` is that package.

    python bench/drain_prepare_cpu.py [--gb 0.5] [--rounds 3] [--formats specforge,speculators] [--package DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (step, substrings of a profiled function's "file:name" that put it there), the first match wins.
_STEPS: list[tuple[str, tuple[str, ...]]] = [
    ("fsync", ("posix.fsync", "os.fsync")),
    ("read", ("preadv", "staged_io.py", "posix.open", "posix.close", "read_done_marker", "dumps.py")),
    ("checksum", ("xxhash", "hashlib", "_hashlib", "'update'", "'digest'", "hexdigest")),
    ("write", ("posix.write", "posix_fadvise", "durable.py", "direct_write.py", "'writev'", "posix.writev")),
    ("fingerprint", ("fingerprint.py",)),
    ("finite/validate", ("validate.py", "aminmax", "'item'", "torch.equal", "isfinite")),
    (
        "serialize",
        (
            "serialization.py",
            "pickle",
            "PyTorchFileWriter",
            "write_record",
            "zipfile",
            "torch_zip",
            "_save",
            "safetensors_header",
            "json",
            "persistent_id",
            "speculators.py",
            "zip.py",
        ),
    ),
    (
        "convert",
        (
            "copyto",
            "prepare.py",
            "base.py",
            "specforge.py",
            "clone",
            "'to'",
            "from_numpy",
            "frombuffer",
            "torch.tensor",
            "'view'",
            "numpy.empty",
            "'reshape'",
        ),
    ),
]


def classify(key: tuple[str, int, str]) -> str:
    name = f"{key[0]}:{key[2]}"
    for step, marks in _STEPS:
        if any(m in name for m in marks):
            return step
    return "other"


def profile_format(fmt_name: str, master: Path, scratch: Path, post_norm: bool) -> tuple[dict[str, float], int, list]:
    """One pass of one worker over every staged dump; (CPU seconds by step, bytes written, top functions)."""
    from hsextract.drain import prepare as p
    from hsextract.drain import validate as v
    from hsextract.formats import get_format
    from hsextract.output.manifest import default_checksum_algorithm
    from hsextract.staging.records import read_record

    fmt = get_format(fmt_name)
    dump = scratch / "dump"
    shutil.copytree(master / "dump", dump)
    if post_norm:
        for marker in dump.glob("*/done.json"):
            marker.write_text(marker.read_text().replace('"pre_norm"', '"post_norm"'))
    tmp = scratch / "tmp"
    tmp.mkdir()
    expected = v.Expected(final_hidden=fmt.final_hidden)
    jobs = []
    for d in sorted(x for x in dump.iterdir() if x.name != "_records"):
        jobs.append(p.Job(d, read_record(dump, d.name), expected, default_checksum_algorithm(), False, True))
    prof = cProfile.Profile(time.thread_time)
    written = 0
    process0, thread0 = time.process_time(), time.thread_time()
    prof.enable()
    for job in jobs:
        out = p.prepare(fmt, tmp, job)
        if not isinstance(out, p.Ready):
            raise SystemExit(f"{fmt_name}: {job.dump.name} did not prepare: {out}")
        written += out.prepared.nbytes
    prof.disable()
    # CPU of the process's other threads (the direct writes' writer threads), which the profile of this one misses.
    others = (time.process_time() - process0) - (time.thread_time() - thread0)
    shutil.rmtree(dump)
    shutil.rmtree(tmp)
    stats = pstats.Stats(prof)
    steps: dict[str, float] = {}
    top = []
    for key, (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        step = classify(key)
        steps[step] = steps.get(step, 0.0) + tottime
        top.append((tottime, step, f"{Path(key[0]).name}:{key[2]}"))
    steps["write (other threads)"] = max(0.0, others)
    top.sort(reverse=True)
    return steps, written, top[:12]


def one_pass(fmt: str, master: Path, scratch: Path, package: Path) -> tuple[dict[str, float], int, list]:
    """`profile_format` in a child process that imports only `package`'s hsextract."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(package.resolve()), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, __file__, "--one", fmt, "--master", str(master), "--scratch", str(scratch)],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{fmt}: the pass failed:\n{done.stderr[-3000:]}")
    steps, written, top = json.loads(done.stdout.strip().splitlines()[-1])
    return steps, written, top


def main() -> int:
    if "--one" in sys.argv:  # a child: one pass of one format, as JSON on the last line
        ap1 = argparse.ArgumentParser()
        ap1.add_argument("--one")
        ap1.add_argument("--master", type=Path)
        ap1.add_argument("--scratch", type=Path)
        a = ap1.parse_args()
        import torch

        torch.set_num_threads(1)  # one worker, as the drain's worker processes run
        print(json.dumps(profile_format(a.one, a.master, a.scratch, a.one != "speculators")))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--formats", default="specforge,speculators")
    ap.add_argument("--package", type=Path, default=REPO / "files" / "python", help="the files/python to profile")
    ap.add_argument(
        "--scratch", type=Path, default=REPO / ".work" / "bench-prepare-cpu", help="a directory on the disk"
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sys.path[:0] = [str(REPO / "bench")]
    from drain_throughput import stage_master

    shm = Path(tempfile.mkdtemp(prefix="hsx-bench-prep-", dir="/dev/shm"))
    result: dict = {"benchmark": "drain_prepare_cpu", "formats": {}}
    try:
        samples, nbytes = stage_master(shm / "master", int(args.gb * 1e9))
        print(f"staged {samples} samples, {nbytes / 1e9:.2f} GB; load {os.getloadavg()}", flush=True)
        for fmt in args.formats.split(","):
            per_round = []
            for _ in range(args.rounds):
                steps, written, top = one_pass(fmt, shm / "master", args.scratch, args.package)
                per_round.append({k: s / (written / 1e9) for k, s in steps.items()})
            keys = sorted({k for r in per_round for k in r})
            med = {k: round(statistics.median(r.get(k, 0.0) for r in per_round), 3) for k in keys}
            total = round(statistics.median(sum(r.values()) for r in per_round), 3)
            result["formats"][fmt] = {
                "cpu_s_per_gb_by_step": med,
                "cpu_s_per_gb": total,
                "top_functions_last_round": [(round(t, 3), s, n) for t, s, n in top],
            }
            print(f"{fmt}: {total:.3f} CPU-s/GB  " + "  ".join(f"{k} {x:.3f}" for k, x in med.items()), flush=True)
            for t, s, n in top:
                print(f"    {t:7.3f} s  {s:16s} {n}")
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(args.scratch, ignore_errors=True)
    result["loadavg_at_end"] = os.getloadavg()
    result["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
