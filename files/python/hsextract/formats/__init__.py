"""Training-set formats the drain writes, and the run manifest every output directory carries.

Each format module turns one validated sample (token ids, loss mask, hidden rows ``[T, K + 1, H]``)
into the bytes of one file of the trainer's layout, and knows the dataset-level files its reader
needs (``sample_lengths.json``, the Arrow dataset). ``FORMATS`` maps the ``--format`` names to them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FormatSpec:
    """What the rest of hsextract needs to know about one ``--format``, without importing its writer."""

    name: str
    trainer: str  # who reads it
    # Where the format wants the final hidden state: SpecForge stores SGLang's post-norm output;
    # speculators re-applies a frozen verifier norm, so it needs the pre-norm residual; ModelOpt's
    # offline reader takes the post-norm state unless a file says otherwise.
    final_hidden: str
    writer: str  # "module:Class" of its OutputFormat (imported lazily: the writers pull in torch)
    # Its finalize builds an Arrow dataset with `datasets`, which the drain imports before its workers start.
    arrow_dataset: bool = False

    def load_writer(self) -> Any:  # -> hsextract.formats.base.OutputFormat
        module, cls = self.writer.split(":")
        return getattr(importlib.import_module(module), cls)()


# The one registry of formats: CLI choices, the capture's final-norm placement, the drain's writer
# and the roles' argument specs (tests/core/test_format_registry.py) all come from it.
FORMATS: dict[str, FormatSpec] = {
    spec.name: spec
    for spec in (
        FormatSpec("specforge", "SpecForge", "post_norm", "hsextract.formats.specforge:SpecForgeFormat"),
        FormatSpec(
            "speculators",
            "speculators >= 0.8",
            "pre_norm",
            "hsextract.formats.speculators:SpeculatorsFormat",
            arrow_dataset=True,
        ),
        FormatSpec(
            "speculators-v1",
            "speculators 0.7 (v1 layout)",
            "pre_norm",
            "hsextract.formats.speculators_v1:SpeculatorsV1Format",
        ),
        FormatSpec("modelopt", "ModelOpt", "post_norm", "hsextract.formats.modelopt:ModelOptFormat"),
    )
}
FORMAT_NAMES: tuple[str, ...] = tuple(FORMATS)
DEFAULT_FORMAT = "speculators"  # the client's and the planner's (the roles' hsextract_format default too)
FINAL_HIDDEN_PLACEMENTS: tuple[str, ...] = ("post_norm", "pre_norm")


def format_spec(name: str) -> FormatSpec:
    """The registry's entry for a ``--format`` name; ConfigError naming the known ones otherwise."""
    from hsextract.errors import ConfigError

    try:
        return FORMATS[name]
    except KeyError:
        raise ConfigError(f"format {name!r}: expected one of {', '.join(FORMAT_NAMES)}") from None


def final_hidden_for(fmt: str, final_hidden: str | None = None, *, what: str = "final_hidden") -> str:
    """The final-norm placement for a format: the format's own when none is given, else the given
    one after checking that the format can use it (raise naming both sides when it cannot)."""
    from hsextract.errors import ConfigError

    needed = format_spec(fmt).final_hidden
    if final_hidden and final_hidden != needed:
        raise ConfigError(
            f"{what} {final_hidden!r} does not fit the format {fmt!r}, which needs {needed!r} final hidden states; "
            f"leave {what} unset (it follows the format) or choose the format that wants {final_hidden!r}"
        )
    return needed


def get_format(name: str) -> Any:  # -> hsextract.formats.base.OutputFormat
    """The writer for a ``--format`` name (imported lazily: the writers pull in torch)."""
    return format_spec(name).load_writer()
