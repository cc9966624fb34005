"""Two versions of the drain side by side, against the disk's ceiling, from the drain's first second.

Each side is the real ``hsextract drain`` process, run from its own package directory (``--baseline``:
an older checkout's ``files/python``; the other side is this checkout's), as the units run it: started
on an empty staging directory, and fed only once it is up (its status says running, and its worker
processes said they started). The dumps (synthetic, as bench/drain_throughput.py stages them) are then
moved in at once, so what is timed is the drain's own work from its first sample: the rate over its
first seconds (``--first-s``, or half the run if shorter) and over the rest, from the manifest's commit
times. The sides alternate in order every round, each on a fresh copy into an empty output directory on
the disk under test; the disk's ceiling (`hsextract.ops.disk_ceiling`) is measured before and after the
rounds, and every rate is also given over it.

    git archive <rev> files/python | tar -x -C /tmp/base
    python bench/drain_ab.py --baseline /tmp/base/files/python [--gb 1.5] [--rounds 3] [--formats speculators,specforge]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "bench")]

from common import machine_info, on_disk_keys  # noqa: E402
from drain_throughput import stage_master, staged_sizes  # noqa: E402
from hsextract.formats import FORMATS  # noqa: E402
from hsextract.ops.disk_ceiling import measure  # noqa: E402
from hsextract.output.layout import client_summary_path  # noqa: E402
from hsextract.output.manifest import iter_entries  # noqa: E402


def _ready(out: Path, log: Path, processes: bool) -> bool:
    try:
        state = json.loads((out / ".hsextract" / "drain-status.json").read_text()).get("state")
    except (OSError, ValueError):
        return False
    return state == "running" and (not processes or "worker processes started" in log.read_text())


_STAMP = """
import json, sys
from pathlib import Path
from hsextract import fingerprint
try:
    from hsextract.staging.dumps import read_states
except ImportError:  # a tree from before staging became a package (e08d5a2)
    from hsextract.staging import read_states
out = {}
for d in Path(sys.argv[1]).iterdir():
    if d.name != "_records":
        st = read_states(d)
        out[d.name] = fingerprint.of_states(st.hidden, st.input_ids)
print(json.dumps(out))
"""


def fingerprints(package: Path, dump: Path) -> dict[str, str]:
    """Every staged dump's fingerprint as `package`'s version of the capture writes it (its definition
    may differ from this checkout's)."""
    done = subprocess.run(
        [sys.executable, "-c", _STAMP, str(dump)],
        env={**os.environ, "PYTHONPATH": str(package)},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def one_side(
    package: Path,
    master: Path,
    shm: Path,
    out: Path,
    fmt: str,
    stamps: dict[str, str],
    args: argparse.Namespace,
    profile: Path | None = None,
) -> dict:
    """Start the drain of `package`, feed it the staged dumps once it is up, wait for its exit; under
    py-spy into `profile` where given."""
    dump, incoming = shm / "dump", shm / "incoming"
    shutil.copytree(master / "dump", incoming)
    for path in incoming.glob("*/done.json"):
        marker = json.loads(path.read_text())
        marker["fingerprint"] = stamps[path.parent.name]
        if FORMATS[fmt].final_hidden == "post_norm":
            marker["final_hidden"] = "post_norm"
        path.write_text(json.dumps(marker))
    (dump / "_records").mkdir(parents=True)
    out.mkdir(parents=True)
    shutil.copy(master / "run" / "run.json", out / "run.json")
    log = out.parent / f"{out.name}.log"
    env = {**os.environ, "PYTHONPATH": str(package), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "hsextract",
        "drain",
        "--dump-dir",
        str(dump),
        "--output",
        str(out),
        "--format",
        fmt,
        "--exit-when-done",
        "--finalize-idle",
        "3600",
        "--worker-mode",
        args.worker_mode,
    ]
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    if profile is not None:  # py-spy samples the drain, its forkserver and its workers, pausing none of them
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        cmd = [
            spy,
            "record",
            "-r",
            "50",
            "--nonblocking",
            "--subprocesses",
            "--threads",
            "-f",
            "raw",
            "-o",
            str(profile),
            "--",
            *cmd,
        ]
    started = time.time()
    cpu0 = _children_cpu()
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        processes = args.worker_mode == "processes" or (args.worker_mode == "auto" and (os.cpu_count() or 1) >= 8)
        while not _ready(out, log, processes):
            if proc.poll() is not None:
                raise SystemExit(f"{package}: the drain exited {proc.returncode} before it was up:\n{log.read_text()}")
            time.sleep(0.05)
        fed = time.time()
        cpu_up = _process_cpu(proc.pid)
        for rec in (incoming / "_records").iterdir():
            os.rename(rec, dump / "_records" / rec.name)
        for d in incoming.iterdir():
            if d.name != "_records":
                os.rename(d, dump / d.name)
        (out / ".hsextract").mkdir(exist_ok=True)
        shutil.copy(master / "client-summary.json", client_summary_path(out))
        rc = proc.wait(1800)
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(incoming, ignore_errors=True)
        shutil.rmtree(dump, ignore_errors=True)
    cpu = _children_cpu() - cpu0
    if rc != 0:
        raise SystemExit(f"{package}: the drain exited {rc}:\n{log.read_text()[-3000:]}")
    entries = sorted(iter_entries(out), key=lambda e: e.written_at)
    total = sum(e.bytes for e in entries)
    end = entries[-1].written_at - fed
    first_s = min(args.first_s, end / 2)
    first = sum(e.bytes for e in entries if e.written_at - fed <= first_s)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "start_to_up_s": round(fed - started, 2),
        "fed_to_last_commit_s": round(end, 3),
        "gb_per_s": total / end / 1e9,
        "first_s": round(first_s, 2),
        "first_gb_per_s": first / first_s / 1e9,
        "rest_gb_per_s": (total - first) / (end - first_s) / 1e9,
        "bytes": total,
        # CPU seconds of the whole drain process (its workers too) per GB: what a busy shared
        # machine disturbs least; start-up included.
        "cpu_s_per_gb": cpu / (total / 1e9),
        # The same from the feeding on: the drain's own work without its start (its process's
        # threads and the children it reaped; worker processes still running at the feed count whole).
        "cpu_s_per_gb_after_up": (cpu - cpu_up) / (total / 1e9),
        # The machine's load when the side ended: a shared machine's other work shows here.
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def _process_cpu(pid: int) -> float:
    """CPU seconds of a running process so far: its threads', and its reaped children's (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime, stime, cutime, cstime


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="the other version's package directory (files/python)")
    ap.add_argument(
        "--baseline-label",
        default="",
        help="what the baseline is, for the JSON (e.g. 'main at 4f9f950'); its path is not written there",
    )
    ap.add_argument("--gb", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--formats", default="speculators,specforge")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--worker-mode", default="auto", choices=("auto", "threads", "processes"))
    ap.add_argument("--first-s", type=float, default=10.0, help="the drain's first seconds, timed apart")
    ap.add_argument("--out-dir", type=Path, default=REPO / ".work" / "bench-drain-ab", help="a directory on the disk")
    ap.add_argument("--ceiling-seconds", type=float, default=3.0)
    ap.add_argument(
        "--profile",
        type=Path,
        help="py-spy (raw, all processes and threads) this tree's drain of each format's first round, into DIR",
    )
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "drain_ab.json")
    args = ap.parse_args()
    sides = {"baseline": args.baseline.resolve(), "this": REPO / "files" / "python"}
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    shm = Path(tempfile.mkdtemp(prefix="hsx-bench-ab-", dir="/dev/shm"))
    base = args.out_dir
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    runs: dict[str, dict[str, list[dict]]] = {}
    try:
        samples, nbytes = stage_master(shm / "master", int(args.gb * 1e9))
        sizes = staged_sizes(shm / "master" / "dump")
        stamps = {name: fingerprints(package, shm / "master" / "dump") for name, package in sides.items()}
        ceilings = [measure(base / "ceiling", sizes, seconds_per_point=args.ceiling_seconds)]
        print(f"staged {samples} samples, {nbytes / 1e9:.2f} GB; {ceilings[0].summary()}", flush=True)
        for fmt in args.formats.split(","):
            runs[fmt] = {name: [] for name in sides}
            for r in range(args.rounds):
                for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
                    profile = args.profile / f"drain-{fmt}.txt" if args.profile and name == "this" and r == 0 else None
                    res = one_side(
                        sides[name], shm / "master", shm, base / f"{fmt}-{name}-{r}", fmt, stamps[name], args, profile
                    )
                    runs[fmt][name].append(res)
                    print(
                        f"  {fmt} round {r} {name:8s}: {res['gb_per_s']:.3f} GB/s (first {res['first_s']:.1f} s "
                        f"{res['first_gb_per_s']:.3f}, rest {res['rest_gb_per_s']:.3f}); up in "
                        f"{res['start_to_up_s']:.1f} s; {res['cpu_s_per_gb']:.2f} CPU-s/GB "
                        f"({res['cpu_s_per_gb_after_up']:.2f} once up); load {res['loadavg']}",
                        flush=True,
                    )
        ceilings.append(measure(base / "ceiling", sizes, seconds_per_point=args.ceiling_seconds))
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
    ceiling = max(c.gb_per_s for c in ceilings)
    formats = {}
    for fmt, by_side in runs.items():
        keys = ("gb_per_s", "first_gb_per_s", "rest_gb_per_s", "start_to_up_s", "cpu_s_per_gb", "cpu_s_per_gb_after_up")
        med = {n: {k: statistics.median(x[k] for x in rs) for k in keys} for n, rs in by_side.items()}
        ratios = [t["gb_per_s"] / b["gb_per_s"] for t, b in zip(by_side["this"], by_side["baseline"], strict=True)]
        cpu = [t["cpu_s_per_gb"] / b["cpu_s_per_gb"] for t, b in zip(by_side["this"], by_side["baseline"], strict=True)]
        cpu_up = [
            t["cpu_s_per_gb_after_up"] / b["cpu_s_per_gb_after_up"]
            for t, b in zip(by_side["this"], by_side["baseline"], strict=True)
        ]
        formats[fmt] = {
            "median": med,
            "this_over_baseline_by_round": [round(x, 3) for x in ratios],
            "cpu_per_gb_this_over_baseline": round(statistics.median(cpu), 3),
            "cpu_per_gb_after_up_this_over_baseline": round(statistics.median(cpu_up), 3),
            "this_over_baseline": round(statistics.median(ratios), 3),
            "over_ceiling": {n: round(m["gb_per_s"] / ceiling, 3) for n, m in med.items()},
            "first_over_rest": {n: round(m["first_gb_per_s"] / m["rest_gb_per_s"], 3) for n, m in med.items()},
            "rounds": by_side,
        }
        print(
            f"{fmt}: this / baseline {formats[fmt]['this_over_baseline']:.3f}, CPU per GB "
            f"{formats[fmt]['cpu_per_gb_this_over_baseline']:.3f} (once up "
            f"{formats[fmt]['cpu_per_gb_after_up_this_over_baseline']:.3f}; by round "
            f"{formats[fmt]['this_over_baseline_by_round']}); over the ceiling {formats[fmt]['over_ceiling']}; "
            f"first seconds over the rest {formats[fmt]['first_over_rest']}"
        )
    last = formats[list(formats)[-1]]["median"]["this"]
    # No path of this machine in the JSON: the baseline by its label, the output directory relative to the checkout.
    root = str(base.resolve().relative_to(REPO)) if base.resolve().is_relative_to(REPO) else base.name
    result = {
        "benchmark": "drain_ab",
        "baseline": args.baseline_label or "<baseline>/files/python",
        "samples": samples,
        "staged_bytes": nbytes,
        "worker_mode": args.worker_mode,
        "workers": args.workers,
        **on_disk_keys(root, ceiling, last["gb_per_s"]),
        "disk_ceiling": [{**c.as_dict(), "directory": f"{root}/ceiling"} for c in ceilings],
        "formats": formats,
        "machine": machine_info(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
