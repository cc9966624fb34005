"""FP8 rows back to bf16: ``hsextract collect --to-bf16`` and ``hsextract pull --to-bf16``.

A set of FP8 rows (hsextract.fp8) is read by speculators' FP8Transfer only. A trainer whose released
reader reads bf16 rows only (SpecForge, ModelOpt, speculators 0.7) gets a set of bf16 files from
it, in its own format (``--format``; the FP8 set's own, speculators, by default). Each file's rows are
dequantized exactly as FP8Transfer does (``fp8.to(bf16) * scale.to(bf16)``), so the aux rows are
what the trainer would have read from the FP8 file, bit for bit; the token ids and the loss mask are
unchanged.

The final state: an FP8 set holds it pre-norm (the speculators format's placement). A format that
stores it post-norm (SpecForge, ModelOpt: what SGLang's head reads) gets the dequantized state
through the model's own final RMSNorm (``--model``: its ``model.norm.weight`` and ``rms_norm_eps``),
in float32 with the weight applied before the one rounding to bf16, as SGLang's fused kernel
computes it. The model must be the set's: where the set recorded the model's fingerprint, the
weights' part must match, else the conversion is refused (another model's norm would give states
no trainer could tell from right ones). The other way, post-norm to pre-norm, cannot be computed
(the norm drops each token's scale) and is refused.

The caller has verified the FP8 file against its manifest row first (size, checksum, shapes, scales,
fingerprint: hsextract.formats.sample_check). The converted file gets a manifest row of its own: its
name in the new format, its size, its checksum and the fingerprint of its bf16 rows
(hsextract.fingerprint, as for any bf16 set), and is verified as written (`Bf16Conversion.verified`)
before it takes the FP8 file's place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hsextract import fingerprint, fp8
from hsextract.durable import write_payload_durably
from hsextract.errors import ConfigError
from hsextract.formats import format_spec, get_format
from hsextract.formats.base import Sample
from hsextract.formats.sample_check import SampleCheck
from hsextract.model_weights import FinalNorm, read_final_norm
from hsextract.output.manifest import ManifestEntry, ManifestHeader, file_problem, new_hasher

CONVERTED_FROM = "converted_from"  # the key of the header's `extra` that says so
FROM_FP8 = "fp8 rows, dequantized as hs_connectors' FP8Transfer does"


@dataclass(frozen=True)
class Bf16Conversion:
    """What ``--to-bf16`` makes of one FP8 set's files: the format they become, that set's header,
    and the final norm where the new format wants the final state post-norm."""

    source: Any  # the FP8 set's format writer (hsextract.formats.base.OutputFormat)
    target: Any  # the bf16 set's format writer
    header: ManifestHeader  # the bf16 set's header
    final_norm: FinalNorm | None = None

    @property
    def reformats(self) -> bool:
        """Whether the files change format (not only precision)."""
        return self.target.name != self.source.name

    def header_of(self, header: ManifestHeader) -> ManifestHeader:
        """`header` as this conversion writes its set: an FP8 set's converted, a bf16 set's as it is."""
        return bf16_header(header, self.target.name, self.final_norm) if header.precision == "fp8" else header

    def entry_of(self, entry: ManifestEntry) -> ManifestEntry:
        """`entry` named as the bf16 set names its file (its checksum still the FP8 file's)."""
        return replace(entry, file=self.target.relative_path(entry.output_index))

    def convert(self, src: Path, dest: Path, entry: ManifestEntry) -> ManifestEntry:
        """Write at `dest` (durably) the bf16 file of the FP8 sample file `src` of manifest row
        `entry`; the row of the new file (its name, size, checksum and fingerprint). ValueError for a
        file that holds no FP8 rows."""
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
        if self.final_norm is not None:
            rows[:, -1] = self.final_norm.apply(rows[:, -1]).to(rows.dtype)
        algorithm = self.header.checksum_algorithm
        hasher = new_hasher(algorithm)
        sample = Sample(entry.rid, entry.dataset_index, ids, mask, rows)
        nbytes = write_payload_durably(dest, self.target.encode(sample), hasher)
        return replace(
            self.entry_of(entry),
            bytes=nbytes,
            checksum=f"{algorithm}:{hasher.hexdigest()}",
            fingerprint=fingerprint.of_states(rows, ids),
        )

    def verified(
        self, src: Path, dest: Path, entry: ManifestEntry, source: ManifestHeader | None = None
    ) -> tuple[ManifestEntry | None, str]:
        """`convert`, then the new file read back from the disk against its new row (size, checksum,
        shapes, fingerprint of the bf16 rows) and the converted header of its set (`source`: the FP8
        set's header, where it is not the one this conversion was made for: one host's of many):
        (the new row, "") or (None, what is wrong); `dest` is removed when it is wrong."""
        try:
            converted = self.convert(src, dest, entry)
        except ValueError as exc:
            dest.unlink(missing_ok=True)
            return None, f"not converted to bf16: {exc}"
        problem = file_problem(dest, converted)
        header = self.header if source is None else self.header_of(source)
        wrong = problem[1] if problem else SampleCheck(self.target, header).content_problem(dest, converted)
        if wrong:
            dest.unlink(missing_ok=True)
            return None, f"its bf16 file, read back, is not its sample: {wrong}"
        return converted, ""


def bf16_header(header: ManifestHeader, fmt: str | None = None, norm: FinalNorm | None = None) -> ManifestHeader:
    """The header of a set converted from `header`'s FP8 set into format `fmt` (its own by default):
    bf16 rows, as FP8Transfer reads them, the final state where `fmt` places it."""
    said = FROM_FP8 + (f"; the final state through the final norm of {norm.model}" if norm is not None else "")
    extra = {**header.extra, CONVERTED_FROM: said}
    fmt = fmt or header.format
    return replace(
        header, format=fmt, final_hidden=format_spec(fmt).final_hidden, precision="bf16", dtype="bfloat16", extra=extra
    )


def bf16_conversion(
    header: ManifestHeader, fmt: str | None = None, model: Path | None = None, what: str = "--to-bf16"
) -> Bf16Conversion:
    """How `header`'s FP8 set becomes a bf16 set of format `fmt` (its own by default); ConfigError,
    before anything is converted, for a format that cannot hold what the set holds, or a model that
    is missing or not the set's where the final state must go through its norm."""
    target = format_spec(fmt or header.format)
    if "bf16" not in target.precisions:
        raise ConfigError(f"{what} --format {target.name}: that format holds no bf16 rows")
    norm = None
    if target.final_hidden != header.final_hidden:
        if (header.final_hidden, target.final_hidden) != ("pre_norm", "post_norm"):
            raise ConfigError(
                f"{what} --format {target.name}: the set holds the final state {header.final_hidden}, the format "
                f"wants it {target.final_hidden}, and that cannot be computed from it (the norm drops each "
                "token's scale); drain the run in that format"
            )
        if model is None:
            raise ConfigError(
                f"{what} --format {target.name}: {target.trainer} reads the final state post-norm and the set holds "
                "it pre-norm; give --model, the set's model directory, whose final norm is applied"
            )
        norm = read_final_norm(model, f"{what} --format {target.name}")
        _check_model(header, norm, what)
    return Bf16Conversion(get_format(header.format), target.load_writer(), bf16_header(header, target.name, norm), norm)


def _check_model(header: ManifestHeader, norm: FinalNorm, what: str) -> None:
    """The model whose norm is applied is the set's: its width, and its weights where the set
    recorded their fingerprint."""
    from hsextract.model_fingerprint import model_fingerprint

    if norm.weight.numel() != header.hidden_size:
        raise ConfigError(
            f"{what} --model {norm.model}: its final norm has {norm.weight.numel()} weights, the set's hidden "
            f"size is {header.hidden_size}: not the set's model"
        )
    recorded = header.model_fingerprint.get("weights")
    if recorded and model_fingerprint(norm.model).get("weights") != recorded:
        raise ConfigError(
            f"{what} --model {norm.model}: its weights are not those of the model the set was captured from "
            f"({header.model_path or 'recorded in manifest.json'}); give that model's directory"
        )
