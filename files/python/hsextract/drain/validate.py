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
from hsextract.records import SampleRecord
from hsextract.staging import DTYPES, DoneMarker, StagedStates

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


def validate(
    marker: DoneMarker, states: StagedStates, record: SampleRecord, expected: Expected, *, check_values: bool = True
) -> None:
    """Raise InvalidDump unless the dump is exactly the configured capture of the recorded sample.

    ``check_values=False`` skips the finite-value scan, for writers that check rows as they stream
    them (`finite_checker`); every other check still runs here.
    """
    _check_marker(marker, record, expected)
    _check_layout(marker, states.hidden, expected)
    _check_tokens(marker, states, record)
    hidden = states.hidden
    if check_values and not all_finite(hidden):
        bad = (~torch.isfinite(hidden.float())).nonzero()
        row, slot = int(bad[0, 0]), int(bad[0, 1])
        raise InvalidDump(NON_FINITE, f"{len(bad)} non-finite values, first at token {row}, slot {slot}")


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


def _check_layout(marker: DoneMarker, hidden: torch.Tensor, expected: Expected) -> None:
    """The rows' shape and dtype are what the marker and the configuration say."""
    if hidden.dim() != 3:
        raise InvalidDump(SHAPE, f"hidden has shape {list(hidden.shape)}, expected [tokens, aux + 1, hidden]")
    _, slots, width = hidden.shape
    if expected.dtype is not None and hidden.dtype != DTYPES[expected.dtype][0]:
        raise InvalidDump(DTYPE, f"hidden is {hidden.dtype}, configured {expected.dtype}")
    if marker.dtype != next((n for n, v in DTYPES.items() if v[0] == hidden.dtype), marker.dtype):
        raise InvalidDump(DTYPE, f"done marker says {marker.dtype}, file holds {hidden.dtype}")
    if expected.hidden_size is not None and width != expected.hidden_size:
        raise InvalidDump(SHAPE, f"hidden size {width}, configured {expected.hidden_size}")
    if expected.num_aux is not None and slots != expected.num_aux + 1:
        raise InvalidDump(SHAPE, f"{slots} hidden slots per token, expected {expected.num_aux} aux layers + 1 final")
    if slots != marker.num_aux + 1:
        raise InvalidDump(SHAPE, f"{slots} hidden slots per token, done marker says {marker.num_aux} aux layers + 1")


def _check_tokens(marker: DoneMarker, states: StagedStates, record: SampleRecord) -> None:
    """The server ran exactly the tokens the client sent, one row each."""
    rows, ids, n = states.hidden.shape[0], states.input_ids, len(record.input_ids)
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


def check_fingerprint(marker: DoneMarker, states: StagedStates) -> str:
    """The staged rows and ids are those the capture fingerprinted inside the forward pass; the
    fingerprint (hex) if so, else InvalidDump. A dump without one comes from a capture that took
    none, and cannot be proven right."""
    if not marker.fingerprint:
        raise InvalidDump(FINGERPRINT, f"done.json carries no fingerprint (staged by hsextract "
                                       f"{marker.hsextract_version or 'of an unknown version'}); the capture and "
                                       "the drain must be of one version: re-run the playbook")
    got = fingerprint.of_states(states.hidden, states.input_ids)
    if got != marker.fingerprint:
        raise InvalidDump(FINGERPRINT, f"the staged rows have fingerprint {got}, the forward pass computed "
                                       f"{marker.fingerprint}: the rows changed between the GPU and the file")
    return got
