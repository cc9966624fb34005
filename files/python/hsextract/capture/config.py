"""The capture's configuration, as rendered into the patch package and read by the hook."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from hsextract.errors import ConfigError
from hsextract.formats import FINAL_HIDDEN_PLACEMENTS, final_hidden_for
from hsextract.layers import CONVENTIONS, parse_ids
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


@dataclass(frozen=True)
class CaptureConfig:
    """What one server's capture does. Rendered as a literal dict into the patch package."""

    architecture: str
    model_path: str
    dump_dir: str
    aux_layer_ids: list[int] | None = None  # None: the EAGLE-3 default for the model's depth
    layer_convention: str = "eagle"
    rid_prefix: str = "hsx"
    final_hidden: str = "post_norm"
    format: str = ""  # the training-set format the capture serves ("": not said); fixes final_hidden
    writer_threads: int = 0  # 0: 8 on CUDA, 2 on CPU
    max_bytes_in_flight: int = 0  # 0: 4 GiB on CUDA, 256 MiB on CPU
    max_tracked_requests: int = 4096
    # Writes from a child process (hsextract.capture.writer_process), so that the scheduler's
    # process does O(1) work per batch; off: writer threads in the scheduler's process. On by
    # default since it measured 0.984 of a plain server's throughput with short prompts on an H200,
    # where the in-process writer measured 0.91-1.06 (bench/results/capture_server_gpu_writer_process_series.json,
    # bench/results/capture_server_gpu_short_series.json; docs/benchmarks.md).
    writer_process: bool = WRITER_PROCESS_DEFAULT
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
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaptureConfig:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"capture config: unknown keys {unknown}; known: {sorted(known)}")
        return cls(**data)
