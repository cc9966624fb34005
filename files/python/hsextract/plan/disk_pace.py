"""``hsextract plan --measure-disk``: the output volume's ceiling, and which of it and the GPU sets the run's pace.

The plan knows the run's bytes per token in its format and, given a prefill rate, the bytes per
second the capture will make. The drain can write no faster than the output volume takes files,
so the plan measures that (`hsextract.ops.disk_ceiling`: the drain's own write pattern, with files
of the run's own sample sizes, a few seconds per writer count, removed afterwards) where the
training set will be written, and says which one binds: the GPU's tokens per second, or the disk's
bytes per second over the bytes per token.
"""

from __future__ import annotations

import os
from pathlib import Path

from hsextract.ops.disk_ceiling import DEFAULT_WRITERS, measure
from hsextract.plan.report import DiskPace, PlanReport
from hsextract.units import binary_size, rate

MIN_FILE = 64 << 10


def disk_pace(report: PlanReport, directory: Path, seconds_per_point: float, bytes_per_point: int) -> DiskPace:
    """The ceiling of the volume holding `directory` and the pace verdict, for the plan's report: the
    sample files are sized as the report's format writes them, at its length percentiles."""
    tokens = max(1, int(report.tokens))
    per_token = report.format_bytes.sample_bytes / tokens
    p = report.length_percentiles
    lengths = [p.get(k) for k in ("p50", "p90", "p99")] if p else [tokens / max(1, report.samples)]
    sizes = sorted({max(MIN_FILE, int(t * per_token)) for t in lengths if t})
    ceiling = measure(
        directory, sizes, DEFAULT_WRITERS, seconds_per_point=seconds_per_point, bytes_per_point=bytes_per_point
    )
    disk_tokens_per_s = ceiling.gb_per_s * 1e9 / per_token if per_token else None
    rate = report.time.tokens_per_s
    paced_by = "unknown"
    if rate is not None and disk_tokens_per_s is not None:
        paced_by = "disk" if disk_tokens_per_s < rate else "gpu"
    return DiskPace(
        ceiling=ceiling.as_dict(),
        bytes_per_token=round(per_token, 1),
        # The drain's workers are its writers: as many as the volume's best writer count, cores permitting.
        drain_workers=max(1, min(ceiling.best.writers, os.cpu_count() or 1)),
        run_bytes_per_s=round(rate * per_token) if rate else None,
        disk_tokens_per_s=round(disk_tokens_per_s) if disk_tokens_per_s else None,
        paced_by=paced_by,
    )


def render(d: DiskPace) -> list[str]:
    """The plan's lines for the measurement."""
    c = d.ceiling
    lines = [
        f"  disk      ceiling {rate(c['disk_ceiling_gb_per_s'] * 1e9)} at {c['directory']} "
        f"({c['best_writers']} writers, "
        f"files of {binary_size(min(c['file_sizes']))}-{binary_size(max(c['file_sizes']))}, "
        "fsync each): at most "
        + (f"{d.disk_tokens_per_s:,} tokens/s" if d.disk_tokens_per_s else "? tokens/s")
        + f" at {binary_size(d.bytes_per_token)} per token"
    ]
    if d.paced_by == "disk":
        lines.append(
            f"  pace      the DISK sets the run's pace: the GPU makes "
            f"{binary_size(d.run_bytes_per_s or 0)}/s, more than the volume takes; "
            "write the set to a faster volume, or expect the drain to be the bound"
        )
    elif d.paced_by == "gpu":
        lines.append(
            f"  pace      the GPU sets the run's pace: it makes "
            f"{binary_size(d.run_bytes_per_s or 0)}/s, within what the volume takes"
        )
    else:
        lines.append("  pace      unknown: no prefill rate (pass --tokens-per-s)")
    lines.append(
        f"  workers   the volume took files fastest from {c['best_writers']} writers: `hsextract drain "
        f"--workers {d.drain_workers}` on this host's cores"
    )
    return lines
