"""What the client's record of a sample costs to write, now and as it was, side by side in one run.

The client writes each sample's record (its ids and loss mask, as JSON) into the staging
directory before it sends the sample: once per sample, on the producer's thread, so its cost
bounds the samples per second one client process can send. Two things made it grow with the run:
`dataclasses.asdict` deep-copied the id lists before encoding them, and each write listed the whole
records directory for orphaned temporaries of its path (a sweep per path, and every record has a
path of its own), so a write cost more the more records were staged. This times both ways on the
same records, alternating, with a directory already holding ``--staged`` records.

    python bench/record_write.py [--records 2000 --staged 256 --tokens 512 --rounds 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "bench")]

from common import machine_info  # noqa: E402
from hsextract import durable  # noqa: E402
from hsextract.staging.names import record_path  # noqa: E402
from hsextract.staging.records import SampleRecord, write_record  # noqa: E402


def write_record_before(dump_dir: Path, record: SampleRecord) -> None:
    """The write as it was: asdict, and atomic_write_bytes sweeping the directory for this path."""
    final = record_path(dump_dir, record.rid)
    durable._SWEPT.discard(final)  # every record path is new to the process, as in a run
    durable.atomic_write_bytes(final, json.dumps(asdict(record), separators=(",", ":")).encode(), durable=False)


def records(n: int, tokens: int, offset: int) -> list[SampleRecord]:
    return [
        SampleRecord(
            rid=f"hsx-ab12cd34-{offset + i}",
            index=offset + i,
            input_ids=list(range(tokens)),
            loss_mask=[i % 2 for i in range(tokens)],
            run_id="ab12cd34",
            source=f"data.jsonl:{i}",
            format="specforge",
            output="/data/out",
        )
        for i in range(n)
    ]


def timed(write, dump: Path, recs: list[SampleRecord]) -> float:
    t0 = time.perf_counter()
    for r in recs:
        write(dump, r)
    return (time.perf_counter() - t0) / len(recs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--staged", type=int, default=256, help="records already in the directory (the client's bound)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "record_write.json")
    args = ap.parse_args()
    sides = {"before": write_record_before, "now": write_record}
    per_record: dict[str, list[float]] = {k: [] for k in sides}
    root = Path(tempfile.mkdtemp(prefix="hsx-record-bench-", dir="/dev/shm"))
    try:
        for r in range(args.rounds):
            for name in ("before", "now") if r % 2 == 0 else ("now", "before"):
                dump = root / f"{name}-{r}"
                for rec in records(args.staged, args.tokens, 10**6):
                    write_record(dump, rec)
                per_record[name].append(timed(sides[name], dump, records(args.records, args.tokens, 0)))
                shutil.rmtree(dump)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in per_record.items()}
    result = {
        "benchmark": "record_write",
        "what": f"one client record of {args.tokens} tokens written into a records directory of {args.staged}+ "
        "records, as it was (asdict, a directory sweep per write) and now, alternating rounds",
        "records_per_round": args.records,
        "rounds": args.rounds,
        "us_per_record": {k: round(v * 1e6, 1) for k, v in med.items()},
        "us_per_record_per_round": {k: [round(x * 1e6, 1) for x in v] for k, v in per_record.items()},
        "now_over_before": round(med["now"] / med["before"], 3),
        "machine": machine_info(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"per record: before {med['before'] * 1e6:.0f} us, now {med['now'] * 1e6:.0f} us; "
        f"now / before {result['now_over_before']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
