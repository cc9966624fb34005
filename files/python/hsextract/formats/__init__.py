"""Training-set formats the drain writes, and the run manifest every output directory carries.

Each format module turns one validated sample (token ids, loss mask, hidden rows ``[T, K + 1, H]``)
into the bytes of one file of the trainer's layout, and knows the dataset-level files its reader
needs (``sample_lengths.json``, the Arrow dataset). ``FORMATS`` maps the ``--format`` names to them.
"""

from __future__ import annotations

FORMAT_NAMES: tuple[str, ...] = ("specforge", "speculators", "speculators-v1", "modelopt")

# Where each format wants the final hidden state (SpecForge stores SGLang's post-norm output;
# speculators re-applies a frozen verifier norm, so it needs the pre-norm residual; ModelOpt's
# offline reader takes the post-norm state unless a file says otherwise).
FINAL_HIDDEN_FOR_FORMAT: dict[str, str] = {
    "specforge": "post_norm",
    "speculators": "pre_norm",
    "speculators-v1": "pre_norm",
    "modelopt": "post_norm",
}


def final_hidden_for(fmt: str, final_hidden: str | None = None, *, what: str = "final_hidden") -> str:
    """The final-norm placement for a format: the format's own when none is given, else the given
    one after checking that the format can use it (raise naming both sides when it cannot)."""
    from hsextract.errors import ConfigError

    if fmt not in FINAL_HIDDEN_FOR_FORMAT:
        raise ConfigError(f"format {fmt!r}: expected one of {', '.join(FORMAT_NAMES)}")
    needed = FINAL_HIDDEN_FOR_FORMAT[fmt]
    if final_hidden and final_hidden != needed:
        raise ConfigError(
            f"{what} {final_hidden!r} does not fit the format {fmt!r}, which needs {needed!r} final hidden states; "
            f"leave {what} unset (it follows the format) or choose the format that wants {final_hidden!r}"
        )
    return needed


def get_format(name: str):  # -> hsextract.formats.base.OutputFormat
    """The writer for a ``--format`` name (imported lazily: the writers pull in torch)."""
    from hsextract.errors import ConfigError

    if name == "specforge":
        from hsextract.formats.specforge import SpecForgeFormat

        return SpecForgeFormat()
    if name == "speculators":
        from hsextract.formats.speculators import SpeculatorsFormat

        return SpeculatorsFormat()
    if name == "speculators-v1":
        from hsextract.formats.speculators_v1 import SpeculatorsV1Format

        return SpeculatorsV1Format()
    if name == "modelopt":
        from hsextract.formats.modelopt import ModelOptFormat

        return ModelOptFormat()
    raise ConfigError(f"format {name!r}: expected one of {', '.join(FORMAT_NAMES)}")
