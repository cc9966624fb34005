"""FP8 rows back to bf16: ``hsextract collect --to-bf16`` and ``hsextract pull --to-bf16``.

A set of FP8 rows (hsextract.fp8) is read by speculators' FP8Transfer only; a consumer that reads
bf16 rows (a SpecForge-style reader, a tool of one's own) gets a set of bf16 files from it. Each file
is converted within the speculators format (the only one that holds FP8 rows): its rows dequantized
exactly as FP8Transfer does (``fp8.to(bf16) * scale.to(bf16)``), so the bf16 file holds what the
trainer would have read from the FP8 one, bit for bit; the token ids and the loss mask unchanged.
Converting to another format's files (SpecForge's ``.ckpt``) is not done: drain the run in that
format for that (the dequantized rows are not the captured ones, so a set converted so would not be
the capture either).

The caller has verified the FP8 file against its manifest row first (size, checksum, shapes, scales,
fingerprint: hsextract.formats.sample_check). The converted file gets a manifest row of its own: its
size, its checksum and the fingerprint of its bf16 rows (hsextract.fingerprint, as for any bf16 set),
and is verified as written (`verified_conversion`) before it takes the FP8 file's place.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hsextract import fingerprint, fp8
from hsextract.durable import write_payload_durably
from hsextract.formats.base import Sample
from hsextract.formats.sample_check import SampleCheck
from hsextract.output.manifest import ManifestEntry, ManifestHeader, file_problem, new_hasher

CONVERTED_FROM = "converted_from"  # the key of the header's `extra` that says so


def bf16_header(header: ManifestHeader) -> ManifestHeader:
    """The header of a set converted from `header`'s FP8 set: bf16 rows, as FP8Transfer reads them."""
    extra = {**header.extra, CONVERTED_FROM: "fp8 rows, dequantized as hs_connectors' FP8Transfer does"}
    return replace(header, precision="bf16", dtype="bfloat16", extra=extra)


def convert(fmt, src: Path, dest: Path, entry: ManifestEntry, checksum_algorithm: str) -> ManifestEntry:
    """Write at `dest` (durably) the bf16 file of the FP8 sample file `src` of manifest row `entry`;
    the row of the new file (its size, checksum and fingerprint). ValueError for a file that holds no
    FP8 rows."""
    from safetensors import safe_open

    with safe_open(str(src), framework="pt") as f:
        names = set(f.keys())
        if fp8.SCALES_KEY not in names:
            raise ValueError(f"{src}: no {fp8.SCALES_KEY}: not a file of FP8 rows")
        q, scales = f.get_tensor("hidden_states"), f.get_tensor(fp8.SCALES_KEY)
        ids, mask = f.get_tensor("token_ids"), f.get_tensor("loss_mask")
    if q.dtype != fp8.DTYPE:
        raise ValueError(f"{src}: hidden_states is {q.dtype}, not FP8 rows")
    rows = fp8.dequantize(q, scales)
    hasher = new_hasher(checksum_algorithm)
    nbytes = write_payload_durably(dest, fmt.encode(Sample(entry.rid, entry.dataset_index, ids, mask, rows)), hasher)
    return replace(
        entry,
        bytes=nbytes,
        checksum=f"{checksum_algorithm}:{hasher.hexdigest()}",
        fingerprint=fingerprint.of_states(rows, ids),
    )


def verified_conversion(
    fmt, src: Path, dest: Path, entry: ManifestEntry, header: ManifestHeader
) -> tuple[ManifestEntry | None, str]:
    """`convert`, then the new file read back from the disk against its new row (size, checksum,
    shapes, fingerprint of the bf16 rows): (the new row, "") or (None, what is wrong); `dest` is
    removed when it is wrong."""
    try:
        converted = convert(fmt, src, dest, entry, header.checksum_algorithm)
    except ValueError as exc:
        dest.unlink(missing_ok=True)
        return None, f"not converted to bf16: {exc}"
    problem = file_problem(dest, converted)
    wrong = problem[1] if problem else SampleCheck(fmt, bf16_header(header)).content_problem(dest, converted)
    if wrong:
        dest.unlink(missing_ok=True)
        return None, f"its bf16 file, read back, is not its sample: {wrong}"
    return converted, ""
