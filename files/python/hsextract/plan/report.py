"""The plan's report, typed: what ``hsextract plan`` prints and keeps as ``plan.json``.

One record (`PlanReport`) with one writer (`hsextract.plan.command.build_report`) and one shape on
disk (`PlanReport.to_json`): the plan prints it (`hsextract.plan.text.render`), the disk
measurement reads its sizes (`hsextract.plan.disk_pace`), and the play reads the JSON (the plan role
hands every host's to ``hsextract fleet plan``, which reads the keys of
`hsextract.fleet.plan_input.REPORT_FIELDS`). So every key is spelled once, here, and the JSON keeps
the keys, their order and their values that the dict before it had: ``to_json`` writes the fields
in their order, and ``from_json(r.to_json()) == r``.

`from_json` reads a report this version wrote: a key it lacks is a KeyError (a report from a host is
checked for the fields the fleet reads by hsextract.fleet.plan_input, not here). Nothing here
imports torch or the tokenizer: the fleet's controller may read reports without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

F = TypeVar("F", bound="_Flat")


def bytes_key(fmt: str, precision: str = "bf16") -> str:
    """A format's entry in the report's `formats` for rows stored in `precision`: its name for bf16,
    ``"<name> fp8"`` for FP8 rows (an entry only for a format whose reader reads them)."""
    return fmt if precision == "bf16" else f"{fmt} {precision}"


@dataclass(frozen=True)
class _Flat:
    """A record of plain JSON values: its object is its fields, in their order."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls: type[F], data: Mapping[str, Any]) -> F:
        return cls(**{f.name: data[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class FormatBytes(_Flat):
    """One format's bytes for the scanned samples (hsextract.plan.estimate)."""

    sample_bytes: int  # the sample files, exactly
    bookkeeping_bytes_estimate: int  # manifest, Arrow dataset, draft vocabulary files
    total_bytes: int
    remaining_bytes: int  # of the samples not written yet: what the output volume must still hold


@dataclass(frozen=True)
class Overlong(_Flat):
    """The samples longer than the longest the run sends, and what the policy does with them."""

    max_tokens: int | None
    policy: str  # --overlong
    samples: int
    truncated: int
    skipped: int


@dataclass(frozen=True)
class ModelLayout(_Flat):
    """What the model gives a sample file's size: its width, the captured layers, the dtype."""

    hidden_size: int
    num_aux: int
    dtype: str
    num_hidden_layers: int
    vocab_size: int


@dataclass(frozen=True)
class StagingRoom(_Flat):
    """The staging directory (/dev/shm) against what the configured in-flight limits need there
    (hsextract.staging.room.estimate_need, as ``check-shm``)."""

    path: str
    mount: str
    free_bytes: int
    need_bytes: int
    ok: bool
    requests: int
    tokens_per_request: int
    bytes_per_token: int
    estimate_bytes: int
    watermark_bytes: int


@dataclass(frozen=True)
class TimeEstimate(_Flat):
    """The run's time at a prefill rate; no rate (None) is no time."""

    tokens_per_s: float | None
    source: str  # where the rate comes from, or why there is none
    seconds: float | None


@dataclass(frozen=True)
class VolumeRoom(_Flat):
    """Whether the output volume holds what the run has left to write, and the margin."""

    path: str
    format: str
    free_bytes: int
    need_bytes: int
    margin_bytes: int
    margin: str  # --space-margin as given
    ok: bool


@dataclass(frozen=True)
class Tokenization(_Flat):
    """How the scan ran; a reused scan keeps the figures of the run that made it."""

    workers: int
    seconds: float
    reused: bool
    samples_per_s: float


@dataclass(frozen=True)
class DiskPace:
    """``--measure-disk``: the volume's measured ceiling and which of it and the GPU sets the pace."""

    ceiling: dict[str, Any]  # hsextract.ops.disk_ceiling's measurement (Ceiling.as_dict), as it writes it
    bytes_per_token: float
    drain_workers: int
    run_bytes_per_s: int | None  # None: no prefill rate
    disk_tokens_per_s: int | None
    paced_by: str  # disk, gpu or unknown

    def to_json(self) -> dict[str, Any]:
        return {
            **self.ceiling,
            "bytes_per_token": self.bytes_per_token,
            "drain_workers": self.drain_workers,
            "run_bytes_per_s": self.run_bytes_per_s,
            "disk_tokens_per_s": self.disk_tokens_per_s,
            "paced_by": self.paced_by,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DiskPace:
        own = [f.name for f in fields(cls) if f.name != "ceiling"]
        return cls(
            ceiling={k: v for k, v in data.items() if k not in own},
            bytes_per_token=data["bytes_per_token"],
            drain_workers=data["drain_workers"],
            run_bytes_per_s=data["run_bytes_per_s"],
            disk_tokens_per_s=data["disk_tokens_per_s"],
            paced_by=data["paced_by"],
        )


@dataclass(frozen=True)
class PlanReport:
    """``hsextract plan``'s report; the fields in the order of the JSON's keys."""

    dataset: str
    model: str
    shard: str  # --shard as given
    format: str  # the format the room is checked for
    precision: str  # ... in this precision (its bytes: formats[bytes_key(format, precision)])
    # What the client will record of the dataset: a fleet's hosts must all read the same one.
    dataset_fingerprint: dict[str, Any]
    rows: int  # of the whole dataset
    rows_in_shard: int
    samples: int  # the server will run
    already_written: int  # of those, in the training set already
    rejects: dict[str, int]  # by reason, sorted
    reject_examples: dict[str, str]  # reason -> one "file:line: detail"
    tokens: int
    loss_masked_tokens: int
    remaining_tokens: int  # of the samples not written yet
    length_percentiles: dict[str, float]  # p50, p90, p99, max, min, mean; empty without samples
    overlong: Overlong
    model_layout: ModelLayout
    formats: dict[str, FormatBytes]  # every format and precision its reader reads, in the registry's order
    shm: StagingRoom
    time: TimeEstimate
    output_volume: VolumeRoom
    tokenization: Tokenization
    disk: DiskPace | None = None  # only with --measure-disk

    @property
    def format_bytes(self) -> FormatBytes:
        """The bytes of the report's own format, in its precision."""
        return self.formats[bytes_key(self.format, self.precision)]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "dataset": self.dataset,
            "model": self.model,
            "shard": self.shard,
            "format": self.format,
            "precision": self.precision,
            "dataset_fingerprint": self.dataset_fingerprint,
            "rows": self.rows,
            "rows_in_shard": self.rows_in_shard,
            "samples": self.samples,
            "already_written": self.already_written,
            "rejects": dict(self.rejects),
            "reject_examples": dict(self.reject_examples),
            "tokens": self.tokens,
            "loss_masked_tokens": self.loss_masked_tokens,
            "remaining_tokens": self.remaining_tokens,
            "length_percentiles": dict(self.length_percentiles),
            "overlong": self.overlong.to_json(),
            "model_layout": self.model_layout.to_json(),
            "formats": {name: f.to_json() for name, f in self.formats.items()},
            "shm": self.shm.to_json(),
            "time": self.time.to_json(),
            "output_volume": self.output_volume.to_json(),
            "tokenization": self.tokenization.to_json(),
        }
        if self.disk is not None:
            out["disk"] = self.disk.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlanReport:
        """The report of `data` as `to_json` wrote it (see the module docstring)."""
        disk = data.get("disk")
        return cls(
            dataset=data["dataset"],
            model=data["model"],
            shard=data["shard"],
            format=data["format"],
            precision=data["precision"],
            dataset_fingerprint=data["dataset_fingerprint"],
            rows=data["rows"],
            rows_in_shard=data["rows_in_shard"],
            samples=data["samples"],
            already_written=data["already_written"],
            rejects=dict(data["rejects"]),
            reject_examples=dict(data["reject_examples"]),
            tokens=data["tokens"],
            loss_masked_tokens=data["loss_masked_tokens"],
            remaining_tokens=data["remaining_tokens"],
            length_percentiles=dict(data["length_percentiles"]),
            overlong=Overlong.from_json(data["overlong"]),
            model_layout=ModelLayout.from_json(data["model_layout"]),
            formats={name: FormatBytes.from_json(f) for name, f in data["formats"].items()},
            shm=StagingRoom.from_json(data["shm"]),
            time=TimeEstimate.from_json(data["time"]),
            output_volume=VolumeRoom.from_json(data["output_volume"]),
            tokenization=Tokenization.from_json(data["tokenization"]),
            disk=None if disk is None else DiskPace.from_json(disk),
        )
