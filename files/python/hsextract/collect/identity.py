"""Which host outputs belong to one training set: the fields that must agree, and the refusal that names them.

Samples of one training set must be interchangeable for the trainer: the same model, the same
layers in both conventions, the final hidden state taken at the same place, the same dtype,
hidden size, format and precision (``collect --to-bf16`` makes every host's rows bf16, so it does
not compare the precision), the same dataset (so that dataset index x is the same row everywhere)
and the same run (so that the hosts are the shards of one run, not outputs that happen to
look alike). A host output that differs in any of them is refused as a whole, naming the host,
the field, the value expected and the value found; nothing of it is collected.

The model is compared by its config's hash (or, where a header has none, its path) and by its
fingerprint (hsextract.model_fingerprint): the weights, the tokenizer and the chat template, each
named when it differs. An output whose header records no fingerprint (an hsextract before them,
or a model given by hub name) is taken with others that have none, compared as before, and refused
beside one that has one: its samples cannot be shown to come from that model, and a collected set
that took both would claim a model for samples it cannot vouch for (docs/fleet.md).

The reference is the collected set's own header when it exists (what was collected before
decides), else the first host output given that has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hsextract.model_fingerprint import PART_NAMES, differing_parts
from hsextract.output.manifest import ManifestHeader

# (header field, its name in a refusal). The model is compared by its config's hash where both
# sides have one (a model may sit at another path on each host), else by its path.
HEADER_FIELDS: tuple[tuple[str, str], ...] = (
    ("format", "format"),
    ("precision", "precision"),
    ("final_hidden", "final-norm placement"),
    ("dtype", "dtype"),
    ("hidden_size", "hidden size"),
    ("num_aux", "number of aux layers"),
    ("eagle_aux_hidden_state_layer_ids", "layers (eagle convention)"),
    ("sglang_layers_to_capture", "layers (sglang convention)"),
    ("num_hidden_layers", "model depth"),
    ("architecture", "architecture"),
    ("run_id", "run identity"),
)


@dataclass(frozen=True)
class Difference:
    """One field in which a host output differs from the reference."""

    field: str
    expected: Any
    actual: Any

    def describe(self) -> str:
        return f"{self.field} is {self.actual!r}, expected {self.expected!r}"


def header_differences(ref: ManifestHeader, other: ManifestHeader, ignore: tuple[str, ...] = ()) -> list[Difference]:
    """How `other` differs from `ref` in what makes samples interchangeable; empty when it does not.
    The fields `ignore` are not compared (a collect that converts the rows: the precision, the dtype)."""
    out = [
        Difference(name, getattr(ref, f), getattr(other, f))
        for f, name in HEADER_FIELDS
        if f not in ignore and getattr(ref, f) != getattr(other, f)
    ]
    if ref.model_config_sha256 and other.model_config_sha256:
        if ref.model_config_sha256 != other.model_config_sha256:
            out.append(Difference("model (config.json sha256)", ref.model_config_sha256, other.model_config_sha256))
    elif ref.model_path != other.model_path:
        out.append(Difference("model path", ref.model_path, other.model_path))
    out += fingerprint_differences(ref.model_fingerprint, other.model_fingerprint)
    if ref.vocab_size and other.vocab_size and ref.vocab_size != other.vocab_size:
        out.append(Difference("vocabulary size", ref.vocab_size, other.vocab_size))
    return out


def dataset_difference(ref: dict[str, Any] | None, other: dict[str, Any] | None) -> Difference | None:
    """How the dataset record `other` (``.hsextract/dataset.json``) differs from `ref`, or None.

    The records' fingerprints (hsextract.output.dataset_record: the heads of the dataset's first
    files) must be equal; the path may differ, as each host reads its own copy.
    """
    if ref is None or other is None:
        if ref is other:
            return None
        return Difference("dataset fingerprint", _fp(ref), _fp(other))
    if ref.get("fingerprint") != other.get("fingerprint"):
        return Difference("dataset fingerprint", _fp(ref), _fp(other))
    return None


def _fp(record: dict[str, Any] | None) -> str:
    """A fingerprint in a line: the dataset's path and its first file's head digest."""
    if record is None:
        return "no record of the dataset (.hsextract/dataset.json)"
    files = (record.get("fingerprint") or {}).get("files") or [{}]
    head = files[0]
    digest = str(head.get("sha256", "?"))[:16]
    return f"{record.get('path', '?')} (first {head.get('bytes', '?')} bytes sha256 {digest})"


def lines_difference(expected: int | None, actual: int | None) -> Difference | None:
    """The dataset's size as the clients counted it must agree, or the shards cannot cover it exactly."""
    if expected is None or actual is None or expected == actual:
        return None
    return Difference("dataset lines", expected, actual)


NO_FINGERPRINT = "none recorded (an output of an hsextract before model fingerprints, or of a model given by name)"


def fingerprint_differences(ref: dict[str, str], other: dict[str, str]) -> list[Difference]:
    """How two headers' model fingerprints differ: each part that differs, or one of them missing."""
    if not ref and not other:
        return []
    if not ref or not other:
        return [Difference("model fingerprint", _fingerprint_line(ref), _fingerprint_line(other))]
    parts = differing_parts(ref, other)
    if parts == ["method"]:
        return [Difference("model fingerprint method", ref.get("method"), other.get("method"))]
    return [Difference(f"model {PART_NAMES[p]} (sha256)", _short(ref.get(p)), _short(other.get(p))) for p in parts]


def _short(digest: str | None) -> str:
    return (digest or "?")[:16]


def _fingerprint_line(fp: dict[str, str]) -> str:
    if not fp:
        return NO_FINGERPRINT
    return ", ".join(f"{PART_NAMES[p]} {_short(fp.get(p))}" for p in PART_NAMES)
