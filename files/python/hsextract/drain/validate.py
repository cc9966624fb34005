"""Is a staged dump a sample we may write? Every check the trainers' readers do not do.

The readers accept wrong shapes, padded rows and mismatched layers silently, and a NaN poisons a
training run hours later, so the drain refuses anything that is not exactly what was configured
and what the client asked for. A refusal carries a short reason code (the first line of the
quarantine's ``reason.txt``) and a sentence saying what differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hsextract import fingerprint
from hsextract.drain.staged_io import RowsLayout
from hsextract.staging.dumps import DTYPES, DoneMarker
from hsextract.staging.records import SampleRecord

# Reason codes, one per way a dump can be wrong.
UNREADABLE = "unreadable"  # states file or done marker truncated / not parseable
INCOMPLETE = "incomplete"  # no done marker long after the dump was last written
TOKEN_MISMATCH = "token_mismatch"  # the server ran other tokens than the client recorded
SHAPE = "shape"  # row count, slot count or hidden size differ
DTYPE = "dtype"
LAYERS = "layers"  # captured at other layers than configured
NON_FINITE = "non_finite"
FINAL_HIDDEN = "final_hidden"  # pre-/post-norm placement does not match the format
RECORD = "record"  # the client's record itself is inconsistent
FINGERPRINT = "fingerprint_mismatch"  # the staged rows are not those the forward pass fingerprinted
GREEDY = "greedy_mismatch"  # the final hidden state does not give the token the server sampled
LOGPROB = "logprob_mismatch"  # the final hidden states do not give the server's own prompt logprobs
PRECISION = "precision"  # the capture staged FP8 rows, and this drain writes bf16 sets


class InvalidDump(Exception):
    """A dump that must be quarantined; `reason` is one of the codes above."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Expected:
    """What every dump of this run must look like (from the configuration and the manifest header)."""

    final_hidden: str
    dtype: str | None = None
    hidden_size: int | None = None
    eagle_aux_hidden_state_layer_ids: tuple[int, ...] | None = None

    @property
    def num_aux(self) -> int | None:
        ids = self.eagle_aux_hidden_state_layer_ids
        return None if ids is None else len(ids)


def all_finite(t: torch.Tensor) -> bool:
    """True if no NaN or inf is in `t`; aminmax propagates both and runs ~40x faster than isfinite."""
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return math.isfinite(lo.item()) and math.isfinite(hi.item())


def finite_checker(dtype: torch.dtype, row_bytes: int):  # -> Callable[[memoryview, int], None]
    """A check for pieces of the staged rows as they stream by: raise InvalidDump at the first NaN/inf."""

    def check(piece: memoryview, offset: int) -> None:
        if not len(piece):
            return
        t = torch.frombuffer(piece, dtype=dtype)
        if all_finite(t):
            return
        first = int((~torch.isfinite(t.float())).nonzero()[0, 0])
        byte = offset + first * t.element_size()
        raise InvalidDump(NON_FINITE, f"non-finite values, first at token {byte // row_bytes}")

    return check


def _first_non_finite_row(block, dtype: torch.dtype) -> int | None:  # block: np.ndarray [rows, bytes]
    """The first row of a uint8 ``[rows, bytes]`` block of `dtype` values holding a NaN or inf, or None."""
    if not block.size:
        return None
    t = torch.from_numpy(block).view(dtype)
    if all_finite(t):
        return None
    return int((~torch.isfinite(t.float())).any(dim=1).nonzero()[0, 0])


def validate(
    marker: DoneMarker, layout: RowsLayout, input_ids: torch.Tensor, record: SampleRecord, expected: Expected
) -> None:
    """Raise InvalidDump unless the dump is exactly the configured capture of the recorded sample,
    from its header's layout and its token ids: everything but the rows' values, which `RowChecks`
    checks as they are read."""
    _check_marker(marker, record, expected)
    _check_layout(marker, layout, expected)
    _check_tokens(marker, layout, input_ids, record)


def _check_marker(marker: DoneMarker, record: SampleRecord, expected: Expected) -> None:
    """The dump, the record and the configuration agree on what was captured."""
    if marker.rid != record.rid:
        raise InvalidDump(UNREADABLE, f"done marker names rid {marker.rid!r}, directory is {record.rid!r}")
    if len(record.input_ids) != len(record.loss_mask):
        raise InvalidDump(
            RECORD, f"record has {len(record.input_ids)} input ids but {len(record.loss_mask)} loss-mask values"
        )
    if marker.final_hidden != expected.final_hidden:
        raise InvalidDump(
            FINAL_HIDDEN,
            f"dump holds the final hidden state {marker.final_hidden!r}, the format needs {expected.final_hidden!r};"
            " configure the capture's final_hidden for this format",
        )
    want_ids = expected.eagle_aux_hidden_state_layer_ids
    if want_ids is not None and tuple(marker.eagle_aux_hidden_state_layer_ids) != tuple(want_ids):
        raise InvalidDump(
            LAYERS,
            f"captured eagle layer ids {marker.eagle_aux_hidden_state_layer_ids}, configured {list(want_ids)}",
        )


def _check_layout(marker: DoneMarker, layout: RowsLayout, expected: Expected) -> None:
    """The rows' shape and dtype are what the marker and the configuration say."""
    _, slots, width = layout.shape()
    if layout.fp8 != (marker.precision == "fp8"):
        raise InvalidDump(DTYPE, f"done marker says {marker.precision} rows, file holds {layout.dtype}")
    if layout.fp8:  # quantized by the capture: the marker says from which dtype
        if expected.dtype is not None and marker.dtype != expected.dtype:
            raise InvalidDump(DTYPE, f"FP8 rows quantized from {marker.dtype}, configured {expected.dtype}")
    else:
        dtype = layout.dtype
        if expected.dtype is not None and dtype != DTYPES[expected.dtype][0]:
            raise InvalidDump(DTYPE, f"hidden is {dtype}, configured {expected.dtype}")
        if marker.dtype != next((n for n, v in DTYPES.items() if v[0] == dtype), marker.dtype):
            raise InvalidDump(DTYPE, f"done marker says {marker.dtype}, file holds {dtype}")
    if expected.hidden_size is not None and width != expected.hidden_size:
        raise InvalidDump(SHAPE, f"hidden size {width}, configured {expected.hidden_size}")
    if expected.num_aux is not None and slots != expected.num_aux + 1:
        raise InvalidDump(SHAPE, f"{slots} hidden slots per token, expected {expected.num_aux} aux layers + 1 final")
    if slots != marker.num_aux + 1:
        raise InvalidDump(SHAPE, f"{slots} hidden slots per token, done marker says {marker.num_aux} aux layers + 1")


def _check_tokens(marker: DoneMarker, layout: RowsLayout, ids: torch.Tensor, record: SampleRecord) -> None:
    """The server ran exactly the tokens the client sent, one row each."""
    rows, n = layout.rows, len(record.input_ids)
    if ids.shape[0] != rows:
        raise InvalidDump(SHAPE, f"{rows} hidden rows but {ids.shape[0]} token ids in the dump")
    if rows != n:
        raise InvalidDump(SHAPE, f"{rows} hidden rows, the client sent {n} tokens")
    if marker.prompt_len != n:
        raise InvalidDump(SHAPE, f"done marker says {marker.prompt_len} tokens, the client sent {n}")
    want = torch.tensor(record.input_ids, dtype=torch.int64)
    if not torch.equal(ids, want):
        first = int((ids != want).nonzero()[0, 0])
        raise InvalidDump(
            TOKEN_MISMATCH,
            f"the server ran token {int(ids[first])} at position {first}, the client sent {int(want[first])}",
        )


def check_fingerprint_stamp(marker: DoneMarker) -> None:
    """The dump carries a fingerprint of the definition this drain computes; else InvalidDump, before
    any row is read. A dump without one comes from a capture that took none, and one of another
    version from a capture of another release: neither can be proven right here."""
    if not marker.fingerprint:
        raise InvalidDump(
            FINGERPRINT,
            f"done.json carries no fingerprint (staged by hsextract "
            f"{marker.hsextract_version or 'of an unknown version'}); the capture and "
            "the drain must be of one version: re-run the playbook",
        )
    version = fingerprint.version_of(marker.fingerprint)
    if version != fingerprint.VERSION:
        said = (
            f"a version-{version} fingerprint"
            if version is not None
            else f"a fingerprint this drain cannot read ({marker.fingerprint[:40]!r})"
        )
        raise InvalidDump(
            FINGERPRINT,
            f"done.json carries {said} (staged by hsextract "
            f"{marker.hsextract_version or 'of an unknown version'}); this drain checks "
            f"version {fingerprint.VERSION}: the capture and the drain must be of one "
            "version: re-run the playbook, and send the samples staged before again",
        )


def matching_fingerprint(total: int, want: str, what: str) -> str:
    """The fingerprint (text) of the rows whose partial fingerprints summed to `total`, if it is the one
    the forward pass computed (`want`); InvalidDump ``fingerprint`` naming `what` otherwise."""
    got = fingerprint.to_text(total)
    if got != want:
        raise InvalidDump(
            FINGERPRINT,
            f"{what} have fingerprint {got}, the forward pass computed {want}: the rows changed between "
            "the GPU and the file",
        )
    return got


class RowChecks:
    """The checks of a dump's rows, fed each piece as the drain reads it (hsextract.drain.staged_io):
    finite values, and the piece's share of the fingerprint. `finish`, after the last piece, raises
    InvalidDump for a fingerprint the forward pass did not compute (the rows changed on their way)
    or else for the first non-finite value (one the forward pass computed), and returns the
    fingerprint. The fingerprint decides first: rows that changed explain a NaN, not the reverse."""

    def __init__(self, marker: DoneMarker, layout: RowsLayout, input_ids: torch.Tensor):
        self._want = marker.fingerprint
        self._layout = layout
        self._row_bytes = layout.row_bytes
        self._ids = input_ids.numpy()
        self._finite = finite_checker(layout.dtype, max(1, self._row_bytes))
        self._sum = 0
        self._rows = 0
        self._non_finite: InvalidDump | None = None
        self.fingerprint = ""  # once `finish` passed

    def piece(self, first_row: int, piece: memoryview) -> None:
        """Rows ``first_row ..`` (whole rows, in order)."""
        n = len(piece) // max(1, self._row_bytes)
        if first_row != self._rows:
            raise ValueError(f"rows {first_row}.. given after {self._rows} rows: the pieces must come in order")
        if self._non_finite is None:
            try:
                self._finite(piece, first_row * self._row_bytes)
            except InvalidDump as exc:
                self._non_finite = exc
        values = fingerprint.row_values_np(piece, self._ids[first_row : first_row + n], self._row_bytes)
        self._sum = fingerprint.add(self._sum, fingerprint.combine(values, first_row))
        self._rows += n

    def parts(self, first_row: int, parts: list) -> None:  # parts: list[np.ndarray]
        """Rows ``first_row ..`` (whole rows, in order) whose bytes are spread over column blocks, as
        `StagedReader.scatter` yields them: the same checks as `piece`, part by part."""
        n = parts[0].shape[0] if parts else 0
        if first_row != self._rows:
            raise ValueError(f"rows {first_row}.. given after {self._rows} rows: the pieces must come in order")
        if self._non_finite is None:
            bad = [row for part in parts if (row := _first_non_finite_row(part, self._layout.dtype)) is not None]
            if bad:
                self._non_finite = InvalidDump(NON_FINITE, f"non-finite values, first at token {first_row + min(bad)}")
        values = fingerprint.row_values_parts_np(parts, self._ids[first_row : first_row + n], self._row_bytes)
        self._sum = fingerprint.add(self._sum, fingerprint.combine(values, first_row))
        self._rows += n

    def finish(self) -> str:
        """The fingerprint, once every row was checked (InvalidDump as the class says)."""
        if self._rows != self._layout.rows:
            raise ValueError(f"{self._rows} of {self._layout.rows} rows checked")
        got = matching_fingerprint(self._sum, self._want, "the staged rows")
        if self._non_finite is not None:
            raise self._non_finite
        self.fingerprint = got
        return got
