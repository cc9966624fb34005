"""The capture's configuration, as rendered into the patch package and read by the hook.

Its fields that a person sets are ``hsextract capture-patch``'s flags, declared once
(hsextract.options; the command's other flags: hsextract.capture.patch.PatchSettings). The Ansible
role writes the same keys into the package it renders.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from typing import Any

from hsextract.errors import ConfigError
from hsextract.formats import FINAL_HIDDEN_PLACEMENTS, FORMAT_NAMES, final_hidden_for
from hsextract.layers import CONVENTIONS, parse_ids
from hsextract.options import option
from hsextract.staging.dumps import STAGED_PRECISIONS
from hsextract.staging.records import check_prefix

# Settings only the tests change, kept out of the roles' interface.
TEST_TUNABLES: dict[str, str] = {
    # Host buffers are sized in multiples of this (default 2 MiB): a small value makes the tiny
    # models' batches leave free buffers of different sizes in the pool, as production batches do.
    "pool_granularity_bytes": "host buffer size granularity in bytes",
    # Fails every k-th prefill batch on purpose, through the path a real failure to queue takes:
    # the proof that every sample still ends in the training set or in the client's failures.
    "testonly_fail_every_kth_batch": "the fault switch: fail every k-th batch (0: off)",
}


PRECISION_DEFAULT = "bf16"  # the capture stages the rows as computed (the play's: hsextract_capture_precision)
WRITER_PROCESS_DEFAULT = True  # the role's capture_patch_writer_process and the CLI's --writer-process follow it


def _flag(name: str, value: Any, default: bool) -> bool:
    """A yes/no setting, also as the text a templating engine may make of it ("True", "false", "1");
    unset (None, "", "None") is ``default``."""
    if isinstance(value, bool):
        return value
    if value is None:
        return default
    if isinstance(value, int):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("", "none", "null"):
        return default
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ConfigError(f"capture config: {name}={value!r} is not a yes/no value (true or false)")


@dataclass(frozen=True, kw_only=True)
class CaptureConfig:
    """What one server's capture does. Rendered as a literal dict into the patch package; its flags
    in ``hsextract capture-patch --help``'s order."""

    # --model as in every other subcommand (one shared run config); --model-path stays accepted.
    model_path: str = option(
        flag="--model",
        aliases=("--model-path",),
        dest="model",
        help="model directory (its config.json names the architecture)",
    )
    # The command reads it from the model's config.json when not given.
    architecture: str = option(required=False, help="override the architecture read from the model's config.json")
    aux_layer_ids: list[int] | None = option(  # None: the EAGLE-3 default for the model's depth
        None,
        flag="--aux-layers",
        aliases=("--aux-layer-ids",),
        dest="aux_layers",
        help="comma-separated aux layer ids (default: EAGLE-3's [1, L//2-1, L-4])",
    )
    layer_convention: str = option("eagle", choices=CONVENTIONS)
    dump_dir: str = option(help="staging directory, e.g. /dev/shm/hsextract")
    rid_prefix: str = option("hsx")
    # The training-set format the capture serves ("": not said); fixes final_hidden.
    format: str = option(
        "",
        parser_default=None,
        choices=FORMAT_NAMES,
        help="the training-set format; sets the final-norm placement it needs",
    )
    final_hidden: str = option(
        "post_norm",
        parser_default=None,
        choices=FINAL_HIDDEN_PLACEMENTS,
        help="final hidden state post- or pre-norm (default: what --format needs, else post_norm)",
    )
    # Writes from a child process (hsextract.capture.writer_process), so that the scheduler's
    # process does O(1) work per batch; off: writer threads in the scheduler's process. On by
    # default since it measured 0.984 of a plain server's throughput with short prompts on an H200,
    # where the in-process writer measured 0.91-1.06 (bench/results/capture_server_gpu_writer_process_series.json,
    # bench/results/capture_server_gpu_short_series.json; docs/benchmarks.md).
    writer_process: bool = option(
        WRITER_PROCESS_DEFAULT,
        action=argparse.BooleanOptionalAction,
        help="write the staged dumps from a child process of the server's scheduler (the "
        "default); --no-writer-process: from threads inside it",
    )
    # "fp8": the rows quantized on the server's device before the copy to the host (hsextract.fp8),
    # so /dev/shm, the copy, the writer and the drain carry half the bytes; the drain then writes them
    # as staged (its --precision fp8), and a bf16 drain quarantines them.
    # Its key in a run's config file is capture_precision: the file's "precision" is the set's (the drain's).
    precision: str = option(
        PRECISION_DEFAULT,
        aliases=("--capture-precision",),
        dest="capture_precision",
        choices=STAGED_PRECISIONS,
        help="how the capture stages the rows: bf16 as computed (the default), or fp8: float8_e4m3fn with one "
        "float32 scale per token, quantized on the server's device before the copy to the host (half the "
        "bytes through /dev/shm); its drain must run with --precision fp8",
    )
    writer_threads: int = 0  # 0: 8 on CUDA, 2 on CPU
    max_bytes_in_flight: int = 0  # 0: 4 GiB on CUDA, 256 MiB on CPU
    max_tracked_requests: int = 4096
    # Test-only tunables, never set by the roles (see TEST_TUNABLES).
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Templating engines may hand every value over as text ("0", "[1, 29, 57]", "None"): normalise.
        ids = self.aux_layer_ids
        if isinstance(ids, str) and ids.strip().lower() in ("", "none", "null", "[]"):
            ids = None
        object.__setattr__(self, "aux_layer_ids", parse_ids(ids))
        for name in ("writer_threads", "max_bytes_in_flight", "max_tracked_requests"):
            try:
                object.__setattr__(self, name, int(getattr(self, name) or 0))
            except (TypeError, ValueError):
                raise ConfigError(f"capture config: {name}={getattr(self, name)!r} is not an integer") from None
        object.__setattr__(self, "writer_process", _flag("writer_process", self.writer_process, WRITER_PROCESS_DEFAULT))
        if self.final_hidden not in FINAL_HIDDEN_PLACEMENTS:
            raise ConfigError(
                f"final_hidden={self.final_hidden!r}: expected one of {', '.join(FINAL_HIDDEN_PLACEMENTS)}"
            )
        if self.format:
            final_hidden_for(self.format, self.final_hidden, what="capture final_hidden")
        if self.precision not in STAGED_PRECISIONS:
            raise ConfigError(
                f"capture config: precision={self.precision!r}: expected one of {', '.join(STAGED_PRECISIONS)} "
                "(how the capture stages the rows; fp8 needs a drain with --precision fp8)"
            )
        if self.layer_convention not in CONVENTIONS:
            raise ConfigError(f"layer_convention={self.layer_convention!r}: expected one of {', '.join(CONVENTIONS)}")
        unknown = sorted(set(self.extra) - set(TEST_TUNABLES))
        if unknown:
            raise ConfigError(f"capture config: unknown extra keys {unknown}; known: {sorted(TEST_TUNABLES)}")
        check_prefix(self.rid_prefix)
        if not self.dump_dir:
            raise ConfigError("dump_dir is empty; give the staging directory (e.g. /dev/shm/hsextract)")

    def tunable(self, name: str, default: int) -> int:
        """A test-only tunable of `extra` as an integer, or ``default``."""
        return int(self.extra.get(name) or default)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def rendered_dict(self) -> dict[str, Any]:
        """`as_dict` without the settings left at their defaults: a default patch is the same bytes
        as before they existed (and as the Ansible role renders it)."""
        data = self.as_dict()
        if self.writer_process == WRITER_PROCESS_DEFAULT:
            del data["writer_process"]
        if self.precision == PRECISION_DEFAULT:
            del data["precision"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaptureConfig:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"capture config: unknown keys {unknown}; known: {sorted(known)}")
        return cls(**data)
