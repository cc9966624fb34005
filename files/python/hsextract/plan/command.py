"""``hsextract plan``: read the dataset as the client will, and say what the run needs before it starts.

Prints, and writes as JSON (``--json``; by default ``<output>/.hsextract/plan.json``; without
either, nothing is written, and the plan says so first): samples, rejects by reason, tokens, loss-masked tokens, length
percentiles, overlong samples; the training set's bytes in every format; the /dev/shm the
configured in-flight limits need (the same estimate as ``check-shm``); the time at a prefill rate;
whether the output volume has room; and, with ``--measure-disk``, the volume's ceiling and whether it
or the GPU sets the run's pace (hsextract.plan.disk_pace). Exits 5 when it has not (with the numbers), unless
``--no-space-check``: the play runs this first, so a run that cannot fit never starts.

The report is one record, `hsextract.plan.report.PlanReport`: `build_report` makes it, `render`
prints it, and its ``to_json`` is the JSON kept (the plan role and ``hsextract fleet plan`` read it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hsextract.config_file import add_config_argument
from hsextract.dataset.chat_template import read_template_file
from hsextract.durable import atomic_write_bytes, free_bytes
from hsextract.errors import ConfigError, HsextractError
from hsextract.formats import DEFAULT_FORMAT, check_precision
from hsextract.objectstore.output import resolve_output
from hsextract.options import add_options, missing_options, options_from
from hsextract.output.layout import plan_path
from hsextract.plan.report import (
    FormatBytes,
    ModelLayout,
    Overlong,
    PlanReport,
    StagingRoom,
    TimeEstimate,
    Tokenization,
    VolumeRoom,
    bytes_key,
)
from hsextract.plan.settings import PlanSettings
from hsextract.plan.text import render
from hsextract.staging.room import aux_count
from hsextract.units import binary_size

if TYPE_CHECKING:
    from hsextract.plan.reuse import Kept
    from hsextract.plan.scan import ScanResult, ScanSettings

EXIT_NO_ROOM = 5


class OutputVolumeTooSmall(HsextractError):
    """The training set will not fit on the output volume."""

    exit_code = EXIT_NO_ROOM


class ReportNotWritten(HsextractError):
    """The report could not be written where ``--json`` asked."""

    exit_code = 73  # sysexits.h EX_CANTCREAT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, PlanSettings)
    add_config_argument(parser)


def settings_from(args: argparse.Namespace) -> PlanSettings:
    """The plan's settings from its flags and the run configuration; ConfigError without a dataset or model."""
    missing = missing_options(PlanSettings, args)
    if missing:
        raise ConfigError(f"plan needs {', '.join(missing)} (as flags or keys of --config)")
    return options_from(PlanSettings, args)


def report_path(args: PlanSettings) -> Path | None:
    """Where the report is kept: --json, else the output's state directory; None without either (a
    plan asked for no place is written nowhere: not into whatever directory it was started in)."""
    return args.json or (plan_path(resolve_output(args.output, args)[0]) if args.output else None)


def build_report(args: PlanSettings, kept: Kept | None = None) -> PlanReport:
    """Scan the dataset and estimate everything; the report. With `kept` (the scan and sizes kept
    beside the report), a scan or sizes of the same inputs are taken from it (unless --rescan), and
    what is made anew is put in it."""
    from hsextract.dataset.reader import dataset_files
    from hsextract.output.manifest import completed_indices

    fmt = args.format or DEFAULT_FORMAT
    check_precision(fmt, args.precision)  # as the drain and the client refuse it
    dataset_files(args.dataset)  # a missing or unusable dataset fails here, before the tokenizer loads
    layout = _model_layout(args)
    # A bucket's run is planned in its work directory: the drain's temporary files and bookkeeping.
    out = resolve_output(args.output, args)[0] if args.output else None
    done = frozenset(completed_indices(out)) if out is not None else frozenset()
    sizes = [
        int(n) for n in ([args.draft_vocab_size] if isinstance(args.draft_vocab_size, int) else args.draft_vocab_size)
    ]
    # What a sample file's size depends on besides its tokens (the key of the kept sizes digests it).
    sized = {"num_aux": layout.num_aux, "hidden_size": layout.hidden_size, "dtype": layout.dtype}
    cfg = _scan_settings(args, done)
    res, formats = _scan_and_size(cfg, sized, layout.vocab_size, sizes, None if args.rescan else kept, kept)
    shm = _staging_room(args, layout, res)
    time_ = _time_estimate(args, layout, res)
    volume_path = out if out is not None else Path(".")
    room = _volume_room(args, volume_path, fmt, formats[bytes_key(fmt, args.precision)])
    report = _report(args, fmt, layout, res, formats, (shm, time_, room))
    if args.measure_disk:
        from hsextract.plan.disk_pace import disk_pace

        disk = disk_pace(
            report, Path(_existing(volume_path)), args.measure_disk_seconds, int(args.measure_disk_gb * 1e9)
        )
        report = dataclasses.replace(report, disk=disk)
    return report


def _model_layout(args: PlanSettings) -> ModelLayout:
    """What a sample's size depends on, from the model's config and --aux-layers."""
    from hsextract.model_info import read_model_info
    from hsextract.staging.dumps import DTYPE_BYTES

    info = read_model_info(args.model)
    return ModelLayout(
        hidden_size=info.hidden_size,
        num_aux=aux_count(args.aux_layers),
        dtype=info.torch_dtype if info.torch_dtype in DTYPE_BYTES else "bfloat16",
        num_hidden_layers=info.num_hidden_layers,
        vocab_size=info.vocab_size,
    )


def _scan_settings(args: PlanSettings, done: frozenset[int]) -> ScanSettings:
    """The scan of the dataset as the client will read it (`done`: the samples written already)."""
    from hsextract.plan.scan import ScanSettings
    from hsextract.shard import Shard

    return ScanSettings(
        Path(args.dataset),
        Path(args.model),
        read_template_file(args.chat_template),
        args.max_tokens,
        args.overlong,
        bool(args.last_turn_only),
        int(args.min_loss_tokens or 0),
        Shard.parse(args.shard, where="--shard"),
        done,
        args.workers,
        progress=not args.no_progress,
        max_row_bytes=int(args.max_row_bytes),
        context_length=args.context_length,
        kv_pool_tokens=args.max_total_tokens,
    )


def _report(
    args: PlanSettings,
    fmt: str,
    layout: ModelLayout,
    res: ScanResult,
    formats: dict[str, FormatBytes],
    room: tuple[StagingRoom, TimeEstimate, VolumeRoom],
) -> PlanReport:
    """The report of a scan and its estimates: the staging's room, the time, the output volume's room."""
    from hsextract.output.dataset_record import head_digest

    shm, time_, volume = room
    return PlanReport(
        dataset=str(args.dataset),
        model=str(args.model),
        shard=args.shard,
        format=fmt,
        precision=args.precision,
        dataset_fingerprint=head_digest(Path(args.dataset)),
        rows=res.lines,
        rows_in_shard=res.in_shard,
        samples=res.samples,
        already_written=res.already_written,
        rejects=dict(sorted(res.rejects.items())),
        reject_examples=res.examples,
        tokens=res.tokens,
        loss_masked_tokens=res.masked_tokens,
        remaining_tokens=res.pending_tokens,
        length_percentiles=res.percentiles(),
        overlong=Overlong(
            max_tokens=res.max_tokens,
            policy=args.overlong,
            samples=res.overlong,
            truncated=res.truncated,
            skipped=res.rejects.get("too_long", 0),
        ),
        model_layout=layout,
        formats=formats,
        shm=shm,
        time=time_,
        output_volume=volume,
        tokenization=Tokenization(
            workers=res.workers,
            seconds=round(res.seconds, 3),
            reused=res.reused,
            samples_per_s=round((res.samples + sum(res.rejects.values())) / max(res.seconds, 1e-9), 1),
        ),
    )


def _staging_room(args: PlanSettings, layout: ModelLayout, res: ScanResult) -> StagingRoom:
    """The staging directory's room for the in-flight limits, at the longest sample the run sends."""
    from hsextract.staging.room import estimate_need, mount_point, parse_size

    longest = max(res.lengths, default=1)
    per_request = min(res.max_tokens or longest, longest)
    # No more requests are staged at once than there are samples left to send; none, nothing is.
    left = res.samples - res.already_written
    requests = min(max(int(args.max_in_flight), int(args.max_staged or 0)), max(left, 0))
    probe = _existing(args.dump_dir)
    st = os.statvfs(probe)
    need = estimate_need(
        hidden_size=layout.hidden_size,
        aux_layers=layout.num_aux,
        requests_in_flight=max(requests, 1),
        tokens_per_request=per_request,
        watermark_bytes=parse_size(args.shm_min_free, st.f_blocks * st.f_frsize),
        dtype=layout.dtype,
        precision=args.capture_precision,
    )
    shm_free = st.f_bavail * st.f_frsize
    need_bytes = need.need_bytes if requests else 0
    return StagingRoom(
        path=str(args.dump_dir),
        mount=mount_point(probe),
        free_bytes=shm_free,
        need_bytes=need_bytes,
        ok=shm_free >= need_bytes,
        requests=requests,
        tokens_per_request=per_request if requests else 0,
        bytes_per_token=need.bytes_per_token,
        estimate_bytes=need.estimate_bytes if requests else 0,
        watermark_bytes=need.watermark_bytes if requests else 0,
    )


def _time_estimate(args: PlanSettings, layout: ModelLayout, res: ScanResult) -> TimeEstimate:
    """The time of the samples left at --tokens-per-s, else at the GPU bench's rate scaled to the model."""
    from hsextract.plan.estimate import bench_rate, default_results_dir

    rate: float | None
    if args.tokens_per_s:
        rate, source = float(args.tokens_per_s), "--tokens-per-s"
    else:
        found = bench_rate(args.bench_results or default_results_dir(), layout.num_hidden_layers)
        rate, source = found if found else (None, "no rate: pass --tokens-per-s")
    return TimeEstimate(tokens_per_s=rate, source=source, seconds=round(res.pending_tokens / rate, 1) if rate else None)


def _volume_room(args: PlanSettings, volume_path: Path, fmt: str, sized: FormatBytes) -> VolumeRoom:
    """Whether the output volume holds what is left to write of format `fmt`, with --space-margin."""
    from hsextract.staging.room import parse_size

    free = free_bytes(volume_path)
    needed = sized.remaining_bytes
    margin = parse_size(args.space_margin, needed)
    return VolumeRoom(
        path=str(volume_path),
        format=fmt,
        free_bytes=free,
        need_bytes=needed,
        margin_bytes=margin,
        margin=str(args.space_margin),
        ok=free >= needed + margin,
    )


def _scan_and_size(
    cfg: ScanSettings,
    layout: dict[str, Any],
    vocab_size: int,
    draft_sizes: list[int],
    reuse_from: Kept | None,
    keep_in: Kept | None,
) -> tuple[ScanResult, dict[str, FormatBytes]]:
    """The scan and every format's bytes: taken from `reuse_from` where it holds them for these
    inputs, else made (and put in `keep_in`)."""
    from hsextract.plan import reuse
    from hsextract.plan.scan import scan

    key = reuse.scan_key(cfg) if keep_in is not None else ""
    res = reuse_from.scan(key, cfg.done) if reuse_from is not None else None
    if res is None:
        res = scan(cfg)
        if keep_in is not None:
            keep_in.keep_scan(key, res)
    sizes_key = reuse.sizes_key(res, layout, vocab_size, draft_sizes) if keep_in is not None else ""
    formats = reuse_from.sizes(sizes_key) if reuse_from is not None else None
    if formats is None:
        formats = _per_format_bytes(res, layout, vocab_size, draft_sizes)
        if keep_in is not None:
            keep_in.keep_sizes(sizes_key, formats)
    return res, formats


def _per_format_bytes(
    res: ScanResult, layout: dict[str, Any], vocab_size: int, draft_sizes: list[int]
) -> dict[str, FormatBytes]:
    """Every format's bytes for the scan (`hsextract.plan.estimate`: the sample files sized by the
    formats' own writers, which import torch)."""
    from hsextract.plan.estimate import Layout, per_format_bytes
    from hsextract.staging.dumps import DTYPES

    return per_format_bytes(
        res.shapes,
        res.pending_shapes,
        res.samples,
        res.tokens,
        res.samples - res.already_written,
        res.pending_tokens,
        Layout(layout["num_aux"], layout["hidden_size"], DTYPES[layout["dtype"]][0]),
        vocab_size,
        draft_sizes,
    )


def _existing(path: str | Path) -> str:
    p = str(path)
    while not os.path.isdir(p):
        parent = os.path.dirname(p.rstrip("/")) or "/"
        if parent == p:
            break
        p = parent
    return p


def _keep_report(report: PlanReport, asked: Path | None, default: Path) -> None:
    """Write the report as JSON. Planning needs no write: where the default place cannot be written
    (a read-only output volume), one line says so and the plan stands; a ``--json`` path asked for
    that cannot be written is an error that says which and why."""
    path = asked or default
    try:
        atomic_write_bytes(path, (json.dumps(report.to_json(), indent=2) + "\n").encode(), durable=False)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if asked is not None:
            raise ReportNotWritten(
                f"cannot write the report to {path} ({why}); pass --json with a writable path"
            ) from exc
        print(
            f"  report    not kept: cannot write {path} ({why}); the plan above stands, --json PATH keeps it elsewhere",
            file=sys.stderr,
        )
        return
    print(f"  report    {path}", file=sys.stderr)


def run(namespace: argparse.Namespace) -> int:
    from hsextract.plan.reuse import Kept, scan_path

    args = settings_from(namespace)
    path = report_path(args)
    if path is None:
        print(
            "plan: no --output or --json: the report and the scan are kept nowhere (--json PATH keeps them, and "
            "a later plan of the same inputs reuses the scan)",
            file=sys.stderr,
        )
    kept = Kept(scan_path(path)) if path is not None else None
    report = build_report(args, kept)
    print(render(report))
    if path is not None and kept is not None:
        _keep_report(report, args.json, path)
        why = kept.write()
        if why is not None:
            print(f"  scan      not kept for the next plan: cannot write {kept.path} ({why})", file=sys.stderr)
    v = report.output_volume
    if not v.ok and not args.no_space_check:
        raise OutputVolumeTooSmall(
            f"{v.path} has {binary_size(v.free_bytes)} free, but the run needs {binary_size(v.need_bytes)} "
            f"({binary_size(report.format_bytes.remaining_bytes)} of {report.format} training set "
            f"for {report.remaining_tokens:,} tokens of {report.samples - report.already_written:,} samples) "
            f"+ {binary_size(v.margin_bytes)} "
            f"margin ({v.margin}). Free space there, point the output elsewhere, plan a shard of the dataset, "
            f"or lower the margin (--space-margin; --no-space-check to start anyway)."
        )
    return 0
