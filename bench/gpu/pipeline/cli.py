"""The command line: the arguments (``python3 bench/gpu/pipeline_gpu.py --help``), the run's
timestamped log lines, the result saved after every step (a run cut short still leaves its JSON),
and the logs packed into ``$OUT`` at the end. Exits 0 only if every check passed."""

from __future__ import annotations

import argparse
import os
import subprocess
import time
import traceback
from pathlib import Path

from .orchestrate import run
from .result import new_result, write_result
from .settings import ALL_SIDES, DEFAULT_MODELS, FORMAT, MODEL_KINDS, REPO

DESCRIPTION = (
    "The product end to end on a GPU: `hsextract extract` and `hsextract drain` as the units run "
    "them,"
)  # the first line of pipeline_gpu.py's docstring, as --help has always shown it


def build_parser() -> argparse.ArgumentParser:
    """Every option of the bench, its defaults the run at SGLang's and the product's defaults."""
    ap = argparse.ArgumentParser(description=DESCRIPTION)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--bundle", type=Path, default=REPO / ".gpu")
    ap.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated, of {MODEL_KINDS}")
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--dsv3-samples", type=int, default=0, help="the tiny DeepSeek's dataset size (0: --samples)")
    ap.add_argument("--dsv3-in-flight", default="", help="the tiny DeepSeek's bounds (default: --in-flight)")
    ap.add_argument(
        "--compare-no-overlap",
        default=DEFAULT_MODELS,
        help="the models whose rows are compared with a no-overlap server's",
    )
    ap.add_argument("--in-flight", default="32,128,256", help="in-flight bounds; the first is the default's")
    ap.add_argument("--rounds", type=int, default=0, help="alternating throughput rounds per side (0: none)")
    ap.add_argument(
        "--throughput-models",
        default="llama8b,tiny",
        help="the models that run the throughput rounds (with --rounds > 0)",
    )
    ap.add_argument(
        "--throughput-in-flight",
        default="",
        help="the throughput rounds' in-flight bounds (default: the first two of --in-flight)",
    )
    ap.add_argument(
        "--correctness-models",
        default=None,
        help="the models whose correctness runs are made (default: every model of --models; the "
        "throughput rounds' pipelines are validated all the same)",
    )
    ap.add_argument(
        "--throughput-format",
        default=FORMAT,
        help="the format of the throughput rounds' sets (speculators for the side pipeline_drain_first_fp8, "
        "so that its bf16 twin pipeline_drain_first writes the same layout)",
    )
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--dp-attention", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-gpu-tests", action="store_true")
    ap.add_argument("--transformers-samples", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=560)
    ap.add_argument("--work", type=Path, default=Path("/tmp/hsx-pipeline"))
    ap.add_argument(
        "--sides",
        default="",
        help=f"only these of the throughput rounds' sides, of {ALL_SIDES} (default: each model's own)",
    )
    ap.add_argument(
        "--output-root",
        type=Path,
        default=None,
        help="where the throughput rounds' training sets go (default: --work); e.g. /dev/shm/hsx-out for "
        "a disk that keeps up with the server",
    )
    ap.add_argument(
        "--profile-client",
        type=Path,
        default=None,
        help="py-spy the (first) client of every product round into this directory",
    )
    ap.add_argument(
        "--reap-output",
        action="store_true",
        help="delete each sample's file once the drain has recorded it: runs longer than memory holds",
    )
    ap.add_argument(
        "--profile-drain",
        type=Path,
        default=None,
        help="py-spy the drain and its worker processes of each product side's first round into this directory",
    )
    ap.add_argument("--results", type=Path)
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, their comma-separated lists split (the in-flight bounds as numbers)."""
    args = build_parser().parse_args(argv)
    args.in_flight = [int(x) for x in args.in_flight.split(",")]
    args.dsv3_in_flight = [int(x) for x in args.dsv3_in_flight.split(",") if x]
    args.throughput_in_flight = [int(x) for x in args.throughput_in_flight.split(",") if x] or args.in_flight[:2]
    args.throughput_models = args.throughput_models.split(",")
    args.correctness_models = (args.models if args.correctness_models is None else args.correctness_models).split(",")
    return args


def main(argv: list[str] | None = None) -> int:
    """The whole run; 0 only if every correctness run, throughput case and check passed."""
    args = parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    args.work.mkdir(parents=True, exist_ok=True)
    args.output_root = args.output_root or args.work
    args.output_root.mkdir(parents=True, exist_ok=True)
    for d in (args.profile_client, args.profile_drain):
        if d:
            d.mkdir(parents=True, exist_ok=True)
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    results_dir = args.results or (REPO / "bench" / "results" if args.device == "cuda" else args.work / "results")
    results_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def say(msg: str) -> None:
        line = f"[{time.monotonic() - t0:6.1f}s] {msg}"
        print(line, flush=True)
        if out_dir:
            with open(out_dir / "pipeline_gpu.log", "a") as f:
                f.write(line + "\n")

    result = new_result(args.device, args.tp, args.dp_attention, args.in_flight, args.samples)

    def save() -> None:
        write_result(result, (results_dir, out_dir))

    try:
        run(args, result, say, save, deadline)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-4000:]
        say(f"FAILED: {result['error']}")
    finally:
        save()
        if out_dir:
            pack_logs(out_dir, (args.work, args.output_root))
    ok = result.get("ok", False)
    say("ALL PASSED" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


def pack_logs(out_dir: Path, roots: tuple[Path, ...]) -> None:
    """The logs alone into ``out_dir/pipeline-logs.tar.gz`` (a kept training set is gigabytes): the
    servers' logs under --work, the clients' and drains' beside their outputs under --output-root."""
    members = []
    for root in dict.fromkeys(roots):
        members += [
            "-C",
            str(root),
            *sorted(str(p.relative_to(root)) for p in root.rglob("*.log") if p.stat().st_size < 50e6),
        ]
    subprocess.run(["tar", "czf", str(out_dir / "pipeline-logs.tar.gz"), *members], check=False, capture_output=True)
