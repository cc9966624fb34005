"""One staged dump and its client record in, one durable temporary sample file out: the drain's
per-sample work, as a plain function of its inputs.

`prepare` reads and checks the dump, has the format encode it, writes
``<output>/.hsextract/tmp/<rid>.tmp`` and fsyncs it, and counts the sample's draft-vocabulary
tokens when asked. It returns what became of the dump (`Ready`, `Invalid` or `NoSpace`) instead
of acting on it: it touches nothing but that temporary file, knows nothing of threads, queues or
the run's accounts, and its inputs and results are plain picklable values. So the same function
runs in the drain's own worker threads and in its worker processes
(hsextract.drain.worker_processes), and the caller (hsextract.drain.worker) reports the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hsextract import fingerprint, fp8
from hsextract.direct_write import write_payload_direct
from hsextract.drain import validate as v
from hsextract.drain.check_queue import CheckRows
from hsextract.drain.fp8_rows import FP8Rows, quantize_whole
from hsextract.drain.fp8_staged import StagedFP8Checks
from hsextract.drain.staged_io import StagedReader
from hsextract.durable import is_no_space, write_payload_durably
from hsextract.errors import StagingError
from hsextract.formats.base import OutputFormat, Sample, SourceRange
from hsextract.logprob_check import checked_positions
from hsextract.output.committer import Prepared
from hsextract.output.manifest import new_hasher
from hsextract.staging.dumps import STATES_FILE, DoneMarker, read_done_marker
from hsextract.staging.records import SampleRecord
from hsextract.vocab.counts import masked_counts

__all__ = ["Invalid", "Job", "NoSpace", "Ready", "prepare"]

# The checks of a dump's rows as the drain reads them: of rows as computed, or of FP8 rows the capture staged.
RowChecker = v.RowChecks | StagedFP8Checks


@dataclass(frozen=True)
class Job:
    """What turning one dump into one file needs, besides the format and the temporary directory."""

    dump: Path
    record: SampleRecord
    expected: v.Expected  # what every dump of the run must look like
    checksum_algorithm: str  # the manifest header's
    count_vocab: bool  # count the sample's loss-masked tokens (the draft vocabulary)
    # fsync the temporary file: it becomes the set's file by a rename. Not for a bucket, where it is
    # only read back for the upload: a crash before the upload leaves the dump staged anyway.
    durable: bool = True
    # Chosen for the self-check: the final rows of up to this many prompt positions come back with
    # the sample (`Ready.check`; 1: the last one, for the greedy check alone). 0: not chosen.
    check_positions: int = 0
    # How the file stores the rows (hsextract.formats.PRECISIONS): "fp8" quantizes the checked rows
    # (hsextract.drain.fp8_rows), and the self-check reads them dequantized, as the trainer will.
    precision: str = "bf16"


@dataclass
class Ready:
    """The sample's temporary file is durable; `marker` is its dump's (the header is written from the first)."""

    prepared: Prepared
    marker: DoneMarker
    counts: tuple | None  # the draft vocabulary's counts of the sample (None: not asked)
    # What the self-check reads (None: not chosen, or its capture recorded no greedy token).
    check: CheckRows | None = None


@dataclass(frozen=True)
class Invalid:
    """A dump that cannot become a sample: quarantine it with this reason."""

    reason: str
    detail: str


@dataclass(frozen=True)
class NoSpace:
    """The output volume was full: nothing was kept; wait for space and prepare the dump again."""

    error: OSError


Outcome = Ready | Invalid | NoSpace


def prepare(fmt: OutputFormat, tmp_dir: Path, job: Job) -> Outcome:
    """Validate the dump of `job`, write its sample durably to its temporary file, and say how it went.

    The staged file is read once (hsextract.drain.staged_io): its ids first, then its rows piece by
    piece, each piece checked (`RowChecks`: the fingerprint, finite values) as it is read. A format
    whose file body is the staged bytes (`streams_staged`) writes each piece as it comes, and the
    fingerprint is settled after the last row, before the file is fsynced: a mismatch removes the
    partial file. A format that stores groups of slots apart (`slot_groups`: SpecForge's aux layers
    and final state) has each checked piece spread into those groups' tensors, its file's own, and is
    encoded once every row passed. A sample chosen for the self-check reads every row into one
    buffer of the drain's own, checked, is encoded from it, and brings back the final rows the
    check reads (`Ready.check`): the check itself runs later, off the sample's way
    (hsextract.drain.check_queue).

    A dump the capture staged in FP8 (its ``precision: fp8``) is checked by `StagedFP8Checks` and
    written as staged, never quantized again; a bf16 drain quarantines it (``precision``)."""
    checked = job.check_positions > 0
    quantized = job.precision == "fp8"
    stream = bool(getattr(fmt, "streams_staged", False)) and not checked
    groups = getattr(fmt, "slot_groups", None) if not checked else None
    if quantized and groups is not None:  # the drain refuses it at start (hsextract.formats.check_precision)
        raise RuntimeError(f"format {fmt.name} stores slot groups apart: it has no FP8 files")
    check = None
    try:
        marker = read_done_marker(job.dump)
        with StagedReader(job.dump / STATES_FILE) as reader:
            v.validate(marker, reader.layout, reader.input_ids, job.record, job.expected)
            v.check_fingerprint_stamp(marker)
            checks = _row_checks(marker, reader, quantized)
            rows = None
            if quantized and reader.scales is None:  # staged bf16: the drain quantizes
                rows = FP8Rows(*reader.layout.shape(), reader.layout.dtype, reader.input_ids)
            if stream:
                ready = _write_streamed(fmt, Path(tmp_dir), job, reader, checks, rows)
            elif groups is not None:
                assert isinstance(checks, v.RowChecks)  # FP8 rows never reach a format of slot groups
                slot_rows = _read_slot_groups(reader, checks, groups(reader.layout.slots))
                ready = _write_temporary(fmt, Path(tmp_dir), job, _sample(job, reader, _meta(reader), None, slot_rows))
            else:
                ready, check = _write_whole(fmt, Path(tmp_dir), job, reader, checks, marker, quantized)
    except StagingError as exc:
        return Invalid(v.UNREADABLE, str(exc))
    except v.InvalidDump as exc:  # from the checks, or met while streaming the rows
        return Invalid(exc.reason, exc.detail)
    except OSError as exc:
        if is_no_space(exc):
            return NoSpace(exc)
        raise
    # Of the rows as the file stores them: the staged rows' (checked against the capture's), or the FP8 rows'.
    ready.prepared.fingerprint = ready.fingerprint or checks.fingerprint
    return Ready(ready.prepared, marker, ready.counts, check)


def _row_checks(marker: DoneMarker, reader: StagedReader, quantized: bool) -> RowChecker:
    """The checks of the dump's rows as they are read: of FP8 rows the capture staged (only for an FP8
    set: InvalidDump ``precision`` for a bf16 one), else of the staged rows as computed."""
    if reader.scales is None:
        return v.RowChecks(marker, reader.layout, reader.input_ids)
    if not quantized:
        raise v.InvalidDump(
            v.PRECISION,
            "the capture stages fp8 (its precision: fp8 quantized these rows on the server) and the drain was "
            "configured bf16 (--precision bf16), so this set cannot hold them; the dump is kept in the "
            "quarantine. Drain with --precision fp8 (hsextract_precision: fp8), or render the capture with "
            "precision bf16, so that the capture and the drain agree",
        )
    return StagedFP8Checks(marker, reader.layout, reader.input_ids, reader.scales)


def _write_whole(
    fmt: OutputFormat, tmp_dir: Path, job: Job, reader: StagedReader, checks: RowChecker, marker, quantized: bool
) -> tuple[_Written, CheckRows | None]:
    """Every row read into the drain's memory and checked, quantized where the set is FP8 and the capture
    staged bf16, written (FP8-staged rows as staged, with their scales); and the self-check's rows of a
    chosen sample, as the trainer will read them (dequantized for FP8)."""
    hidden = _read_whole(reader, checks)
    scales, stored = reader.scales, ""
    if quantized and scales is None:
        hidden, scales, stored = quantize_whole(hidden, reader.input_ids)
    check = _check_rows(marker, hidden, job.check_positions, scales) if job.check_positions else None
    written = _write_temporary(fmt, tmp_dir, job, _sample(job, reader, hidden, None, scales=scales))
    written.fingerprint = stored
    return written, check


def _check_rows(marker: DoneMarker, hidden, most: int, scales=None) -> CheckRows | None:
    """The final rows the self-check reads, at up to `most` prompt positions (the last one last), as
    the trainer will read them: of `hidden` ``[T, K + 1, H]``, or given its `scales`, of FP8 rows
    dequantized as hs_connectors' FP8Transfer does (per token, so these rows alone give what the whole
    would). None where the capture recorded no greedy token to check them against."""
    import torch

    if marker.greedy_token < 0:
        return None
    positions = checked_positions(hidden.shape[0], most)
    rows = hidden[positions, -1].contiguous()
    if scales is not None:
        rows = fp8.dequantize(rows, scales[positions].reshape(-1, 1))
    return CheckRows(
        data=rows.view(-1).view(torch.uint8).numpy().tobytes(),
        dtype=str(rows.dtype).removeprefix("torch."),
        hidden_size=rows.shape[-1],
        positions=tuple(positions),
        final_hidden=marker.final_hidden,
        token=marker.greedy_token,
        fp8=scales is not None,
    )


@dataclass
class _Written:
    prepared: Prepared
    counts: tuple | None
    fingerprint: str = ""  # of the stored rows, where they are not the staged ones (FP8)


def _read_whole(reader: StagedReader, checks: RowChecker):  # -> torch.Tensor
    """Every row into one buffer of the drain's own, each piece checked as it lands; the rows as a
    ``[T, K + 1, H]`` tensor of that buffer, once the fingerprint and the values passed."""
    import numpy as np
    import torch

    layout = reader.layout
    buf = np.empty(layout.rows_bytes, dtype=np.uint8)  # numpy asks for huge pages for a large one
    for first, piece in reader.pieces(buf.data):
        checks.piece(first, piece)
    checks.finish()
    return torch.from_numpy(buf).view(layout.dtype).reshape(layout.shape())


def _read_slot_groups(
    reader: StagedReader, checks: v.RowChecks, groups: list[tuple[int, int]]
):  # -> dict[tuple[int, int], torch.Tensor]
    """The rows' slots [a, b) of each group as ``[T, (b - a) * H]`` tensors of their own, once every row
    passed. Where the groups tile a row in order, the kernel reads the rows straight into them
    (`StagedReader.scatter`) and the checks read them there, piece by piece while in the CPU cache;
    else each piece is read whole and copied into the groups."""
    import numpy as np
    import torch

    layout = reader.layout
    slot_bytes = layout.row_bytes // max(1, layout.slots)
    out = {g: np.empty((layout.rows, (g[1] - g[0]) * slot_bytes), dtype=np.uint8) for g in groups}
    width = fingerprint.word_bytes(layout.row_bytes)
    bounds = [0, *(b for _, b in groups)]
    if [a for a, _ in groups] == bounds[:-1] and bounds[-1] == layout.slots and (slot_bytes % width == 0):
        for first, parts in reader.scatter(list(out.values())):
            checks.parts(first, parts)
    else:
        for first, piece in reader.pieces():
            checks.piece(first, piece)
            rows = np.frombuffer(piece, dtype=np.uint8).reshape(-1, layout.row_bytes)
            for (a, b), dest in out.items():
                np.copyto(dest[first : first + len(rows)], rows[:, a * slot_bytes : b * slot_bytes], casting="no")
    checks.finish()
    return {g: torch.from_numpy(arr).view(layout.dtype) for g, arr in out.items()}


def _meta(reader: StagedReader):  # -> torch.Tensor
    """The rows' shape and dtype without their data, for a format that gets them another way."""
    import torch

    return torch.empty(reader.layout.shape(), dtype=reader.layout.dtype, device="meta")


def _write_streamed(
    fmt: OutputFormat, tmp_dir: Path, job: Job, reader: StagedReader, checks: RowChecker, rows: FP8Rows | None
) -> _Written:
    """The format's file with the staged rows and ids streamed through it, each piece checked, then
    hashed and written (quantized first, given `rows`: an FP8 set of bf16 staging; FP8-staged rows as
    staged, their scales after); the fingerprint is settled before the ids, and the FP8 scales
    checked, so a mismatch fails the write."""
    import torch

    stored = [""]

    def pieces():  # -> Iterator[memoryview]
        for first, piece in reader.pieces():
            checks.piece(first, piece)
            yield piece if rows is None else rows.piece(first, piece)
        checks.finish()
        if rows is not None:
            stored[0] = rows.finish()[1]
        yield reader.ids_bytes

    staged_scales = reader.scales
    if rows is None and staged_scales is None:  # staged bf16, stored bf16
        sample = _sample(job, reader, _meta(reader), SourceRange(reader.data_len, pieces()))
    elif rows is None and staged_scales is not None:  # FP8-staged: rows and ids, then the scales (checked by then)
        scale_bytes = staged_scales.reshape(-1).view(torch.uint8).numpy().data
        scales = SourceRange(len(scale_bytes), iter([scale_bytes]))
        sample = _sample(job, reader, _meta(reader), SourceRange(reader.data_len, pieces()), scales=scales)
    else:
        assert rows is not None
        hidden = torch.empty(rows.shape, dtype=fp8.DTYPE, device="meta")
        body = SourceRange(rows.fp8_bytes + len(reader.ids_bytes), pieces())
        sample = _sample(job, reader, hidden, body, scales=SourceRange(4 * reader.layout.rows, rows.scale_bytes()))
    written = _write_temporary(fmt, tmp_dir, job, sample)
    if not checks.fingerprint or (rows is not None and not stored[0]):
        raise RuntimeError(
            f"format {fmt.name} wrote {job.record.rid} without streaming every staged row through the checks"
        )
    written.fingerprint = stored[0]
    return written


def _sample(job: Job, reader: StagedReader, hidden, staged: SourceRange | None, slot_rows=None, scales=None) -> Sample:
    record = job.record
    return Sample(
        rid=record.rid,
        dataset_index=record.index,
        input_ids=reader.input_ids,
        loss_mask=_as_int64(record.loss_mask),
        hidden=hidden,
        staged=staged,
        slot_rows=slot_rows,
        scales=scales,
    )


def _write_temporary(fmt: OutputFormat, tmp_dir: Path, job: Job, sample: Sample) -> _Written:
    """Encode a validated dump into its durable temporary file; the committer gives it its name."""
    record = job.record
    tmp = tmp_dir / f"{record.rid}.tmp"
    hasher = new_hasher(job.checksum_algorithm)
    if job.durable:  # around the page cache: the drain never reads the file back (hsextract.direct_write)
        nbytes = write_payload_direct(tmp, fmt.encode(sample), hasher)
    else:  # read back for an upload: through the page cache, not fsynced
        nbytes = write_payload_durably(tmp, fmt.encode(sample), hasher, durable=False)
    checksum = f"{job.checksum_algorithm}:{hasher.hexdigest()}"
    # Counted from the very tensors written.
    counts = masked_counts(sample.input_ids, sample.loss_mask) if job.count_vocab else None
    prepared = Prepared(record.rid, record.index, len(record.input_ids), tmp, nbytes, checksum, job.dump)
    return _Written(prepared, counts)


def _as_int64(values: list[int]):  # -> torch.Tensor
    import torch

    return torch.tensor(values, dtype=torch.int64)
