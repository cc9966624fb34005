"""What every bench records beside its numbers: the machine it ran on, so results stay comparable."""

from __future__ import annotations

import os
import platform


def machine_info() -> dict:
    """The bench's ``"machine"`` block: core count, platform, Python version and the load averages.

    Call it when the measurements are done: ``loadavg_at_end`` is the load at that moment, which says
    whether other work on a shared machine may have disturbed the run.
    """
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_at_end": os.getloadavg(),
    }


def on_disk_keys(
    output_root: str,
    ceiling_gb_per_s: float | None,
    drain_gb_per_s: float | None,
    *,
    reaped: bool = False,
    whole_over_ceiling: float | None = None,
) -> dict:
    """The keys every drain or pipeline figure carries (issue 40): where the set was written, whether
    its files were deleted as they were recorded (``reaped``), the disk's ceiling measured in the same
    call (`hsextract.ops.disk_ceiling`), the drain's rate, and the whole pipeline's tokens/s over
    min(the plain loop's tokens/s, the ceiling's bytes/s over the bytes per token), where a pipeline ran."""
    return {
        "output_root": output_root,
        "reaped": reaped,
        "disk_ceiling_gb_per_s": None if ceiling_gb_per_s is None else round(ceiling_gb_per_s, 3),
        "drain_gb_per_s": None if drain_gb_per_s is None else round(drain_gb_per_s, 3),
        "whole_pipeline_on_disk_over_ceiling": None if whole_over_ceiling is None else round(whole_over_ceiling, 3),
    }


def pipeline_over_ceiling(
    pipeline_tok_s: float, plain_tok_s: float, ceiling_gb_per_s: float, bytes_per_token: float
) -> float:
    """The whole pipeline's tokens/s over the most it could do: the GPU's (the plain loop's) or the disk's."""
    disk_tok_s = ceiling_gb_per_s * 1e9 / bytes_per_token if bytes_per_token > 0 else float("inf")
    return pipeline_tok_s / min(plain_tok_s, disk_tok_s)
