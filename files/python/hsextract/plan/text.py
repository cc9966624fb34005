"""The plan's report as lines a person reads (``hsextract plan`` prints them; `--json` writes
hsextract.plan.report's record instead)."""

from __future__ import annotations

from hsextract.plan.report import PlanReport, bytes_key
from hsextract.units import binary_size, duration


def render(r: PlanReport) -> str:
    """The report as lines a person reads."""
    lines = [f"plan: {r.dataset} with {r.model} (shard {r.shard})"]
    rej = ", ".join(f"{k} {v}" for k, v in r.rejects.items()) or "none"
    lines.append(
        f"  samples   {r.samples:,} of {r.rows_in_shard:,} rows in this shard"
        f" ({r.already_written:,} already written); rejects: {rej}"
    )
    p = r.length_percentiles
    if p:
        lines.append(
            f"  tokens    {r.tokens:,} ({r.loss_masked_tokens:,} loss-masked); per sample "
            f"p50 {p['p50']:.0f}, p90 {p['p90']:.0f}, p99 {p['p99']:.0f}, max {p['max']}"
        )
    o = r.overlong
    lines.append(
        f"  overlong  {o.samples:,} samples over {o.max_tokens} tokens "
        f"({o.truncated:,} truncated, {o.skipped:,} skipped)"
    )
    for name, f in r.formats.items():
        mark = " <-" if name == bytes_key(r.format, r.precision) else ""
        lines.append(
            f"  {name:15s} {binary_size(f.total_bytes):>11s} ({binary_size(f.sample_bytes)} of sample files){mark}"
        )
    lines.append(_staging_line(r))
    t = r.time
    if t.seconds is not None and t.tokens_per_s is not None:
        lines.append(
            f"  time      {duration(t.seconds)} for {r.remaining_tokens:,} tokens at "
            f"{t.tokens_per_s:,.0f} tokens/s ({t.source})"
        )
    else:
        lines.append(f"  time      unknown ({t.source})")
    v = r.output_volume
    verdict = "room" if v.ok else "NOT ENOUGH ROOM"
    lines.append(
        f"  output    {verdict}: {binary_size(v.free_bytes)} free at {v.path}, the run needs "
        f"{binary_size(v.need_bytes)} + {binary_size(v.margin_bytes)} margin ({bytes_key(r.format, r.precision)})"
    )
    if r.disk is not None:
        from hsextract.plan.disk_pace import render as render_disk

        lines += render_disk(r.disk)
    k = r.tokenization
    if k.reused:
        lines.append(
            "  tokenized earlier: the scan kept beside the report, of the same dataset, model and settings "
            "(--rescan scans again)"
        )
    else:
        lines.append(f"  tokenized {k.samples_per_s:,.0f} samples/s on {k.workers} processes")
    return "\n".join(lines)


def _staging_line(r: PlanReport) -> str:
    s = r.shm
    if not s.requests:
        return (
            f"  /dev/shm  nothing to stage: no sample of this shard is left to send; "
            f"{binary_size(s.free_bytes)} free at {s.path}"
        )
    return (
        f"  /dev/shm  needs {binary_size(s.need_bytes)} for {s.requests} requests x "
        f"{s.tokens_per_request} tokens at {s.path}; {binary_size(s.free_bytes)} free"
        f"{'' if s.ok else ' (TOO SMALL)'}"
        # The drain quantizes: what the capture stages stays as captured.
        f"{' (staged as captured: the drain quantizes to fp8)' if r.precision != 'bf16' else ''}"
    )
