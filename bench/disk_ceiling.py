"""The disk's ceiling for the drain's write pattern, on a directory of the disk to test.

N writers (1, 4, 8, 16 by default) each write files of the run's sample sizes, fsync each, rename
it into place and fsync the directory (`hsextract.ops.disk_ceiling`); the best rate is the ceiling
every drain figure is compared with. `cp -r` + `sync` (one writer) and ``dd`` (one stream) are not it.

    python bench/disk_ceiling.py --dir .work/bench-disk [--sizes-mb 8,32,64] [--writers 1,4,8,16] [--seconds 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "bench")]

from common import machine_info  # noqa: E402
from hsextract.ops.disk_ceiling import DEFAULT_WRITERS, measure  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=REPO / ".work" / "bench-disk", help="a directory on the disk to test")
    ap.add_argument("--sizes-mb", default="8,32,64", help="file sizes in MB, taken in turn (the run's sample sizes)")
    ap.add_argument("--writers", default=",".join(map(str, DEFAULT_WRITERS)))
    ap.add_argument("--seconds", type=float, default=4.0, help="at most this long per writer count")
    ap.add_argument("--gb", type=float, default=4.0, help="at most this many GB per writer count")
    ap.add_argument("--json", type=Path, default=None, help="where to write the result")
    a = ap.parse_args()
    sizes = [int(float(x) * 1e6) for x in a.sizes_mb.split(",")]
    ceiling = measure(
        a.dir,
        sizes,
        [int(x) for x in a.writers.split(",")],
        seconds_per_point=a.seconds,
        bytes_per_point=int(a.gb * 1e9),
    )
    result = {
        "benchmark": "disk_ceiling",
        **ceiling.as_dict(),
        "machine": machine_info(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    print(ceiling.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
