"""Training-set formats the drain writes, and the run manifest every output directory carries.

Each format module turns one validated sample (token ids, loss mask, hidden rows ``[T, K + 1, H]``)
into the bytes of one file of the trainer's layout, and writes the dataset-level files its reader
needs (``sample_lengths.json``, the Arrow dataset). ``FORMATS`` maps the ``--format`` names to their
registry entries, which hold every other fact of a format: its placement of the final hidden state,
its dtypes, its dataset-level files and their sizes, its trainer's draft-vocabulary files, and how
its trainer loads a set.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from hsextract.options import Option

STAGED_DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32")  # what the capture stages (staging.dumps)
# How a set stores its rows (``--precision``): "bf16", the rows as captured (the model's dtype, bf16
# for every model served so far), or "fp8", float8_e4m3fn with one float32 scale per token
# (hsextract.fp8), which only a format whose released reader dequantizes it may hold.
PRECISIONS: tuple[str, ...] = ("bf16", "fp8")
DEFAULT_PRECISION = "bf16"


@dataclass(frozen=True)
class VocabFile:
    """One draft-vocabulary file a trainer reads, per draft size.

    `name` is relative to the output directory, with ``{size}`` (``-<N>`` in each size's file, nothing
    in the first size's unsuffixed link) and ``{pt}`` (``.pt``, or ``.pth`` where a format's reader
    takes every file ending in "pt" as a sample). `kind` is what it holds, written by
    hsextract.vocab.files: ``mapping`` (SpecForge's {"d2t", "t2d"}), ``d2t`` / ``t2d`` (numpy, sorted
    ids), ``frequency_d2t`` (torch, in frequency order)."""

    kind: str
    name: str


@dataclass(frozen=True, kw_only=True)
class FormatSpec:
    """Everything the rest of hsextract needs to know about one ``--format``, without importing its
    writer: a new format is its writer module and this entry (tests/core/test_format_registry.py
    holds every entry to having each fact)."""

    name: str
    trainer: str  # who reads it
    # Where the format wants the final hidden state: SpecForge stores SGLang's post-norm output;
    # speculators re-applies a frozen verifier norm, so it needs the pre-norm residual; ModelOpt's
    # offline reader takes the post-norm state unless a file says otherwise.
    final_hidden: str
    writer: str  # "module:Class" of its OutputFormat (imported lazily: the writers pull in torch)
    # The dtypes of the captured states its files hold (the drain refuses a model of another).
    dtypes: tuple[str, ...]
    # The precisions (`PRECISIONS`) its trainer's released reader reads: "fp8" only where that reader
    # dequantizes FP8 rows itself (the drain, the client and the plan refuse any other at start).
    precisions: tuple[str, ...]
    # The dataset-level files its finalize writes beside the samples (the paths it returns), and an
    # estimate of their size for the plan: bytes per sample and per token.
    dataset_files: tuple[str, ...]
    dataset_bytes_per_sample: int
    dataset_bytes_per_token: int
    # Its finalize builds an Arrow dataset with `datasets`, which the drain imports before its workers start.
    arrow_dataset: bool = False
    # Its trainer's draft-vocabulary files (a format whose files are another's is not listed apart).
    vocab_files: tuple[VocabFile, ...]
    # How its trainer is pointed at a set, for a collected set's card ("<set>": the set's path).
    loading: str
    # What its trainer is told besides `loading` for a set of FP8 rows (where "fp8" is in `precisions`).
    fp8_loading: str = ""

    def load_writer(self) -> Any:  # -> hsextract.formats.base.OutputFormat
        module, cls = self.writer.split(":")
        return getattr(importlib.import_module(module), cls)()


SPECULATORS_VOCAB = (VocabFile("d2t", "d2t{size}.npy"), VocabFile("t2d", "t2d{size}.npy"))

# The one registry of formats: CLI choices, the capture's final-norm placement, the drain's writer,
# the plan's sizes, the draft vocabulary's files, the collected set's card and the roles' argument
# specs (tests/core/test_format_registry.py) all come from it.
FORMATS: dict[str, FormatSpec] = {
    spec.name: spec
    for spec in (
        FormatSpec(
            name="specforge",
            trainer="SpecForge",
            final_hidden="post_norm",
            writer="hsextract.formats.specforge:SpecForgeFormat",
            dtypes=STAGED_DTYPES,
            precisions=("bf16",),
            dataset_files=(),
            dataset_bytes_per_sample=0,
            dataset_bytes_per_token=0,
            vocab_files=(VocabFile("mapping", "vocab_mapping/vocab_mapping{size}{pt}"),),
            loading="SpecForge: `--train-hidden-states-path <set>` (its offline reader walks the tree for `*.ckpt`, "
            "sorted by path: `reader_order.json` lists that order), `--vocab-mapping-path "
            "<set>/vocab_mapping/vocab_mapping.pt`.",
        ),
        FormatSpec(
            name="speculators",
            trainer="speculators >= 0.8",
            final_hidden="pre_norm",
            writer="hsextract.formats.speculators:SpeculatorsFormat",
            dtypes=STAGED_DTYPES,
            precisions=("bf16", "fp8"),  # fp8: hs_connectors 0.9's FP8Transfer (`--hidden-states-backend fp8`)
            # The Arrow dataset (datasets.save_to_disk): state.json names its data files.
            dataset_files=("state.json",),
            dataset_bytes_per_sample=32,  # list offsets and seq_len
            dataset_bytes_per_token=16,  # input_ids + loss_mask, int64 each
            arrow_dataset=True,
            vocab_files=SPECULATORS_VOCAB,
            loading="speculators >= 0.8: `--data-path <set>` (`hidden_states/hs_{i}.safetensors` is row i of the "
            "Arrow dataset); it finds `d2t.npy`/`t2d.npy` (or `d2t-<N>.npy` with `--draft-vocab-size N`) there.",
            fp8_loading="`--hidden-states-backend fp8` (hs_connectors' FP8Transfer dequantizes each file's "
            "rows to bf16 as it loads them).",
        ),
        FormatSpec(
            name="speculators-v1",
            trainer="speculators 0.7 (v1 layout)",
            final_hidden="pre_norm",
            writer="hsextract.formats.speculators_v1:SpeculatorsV1Format",
            dtypes=STAGED_DTYPES,
            precisions=("bf16",),
            dataset_files=("sample_lengths.json", "data_config.json"),
            dataset_bytes_per_sample=16,  # its sample_lengths.json entry
            dataset_bytes_per_token=0,
            vocab_files=SPECULATORS_VOCAB,  # the 0.7 script's default is d2t.npy
            loading="speculators 0.7 (`--legacy-data`): `--data-path <set>` (`data_{i}.pt` with "
            "`sample_lengths.json`); the vocabulary files end in `.pth`, pass them by path.",
        ),
        FormatSpec(
            name="modelopt",
            trainer="ModelOpt",
            final_hidden="post_norm",
            writer="hsextract.formats.modelopt:ModelOptFormat",
            dtypes=STAGED_DTYPES,
            precisions=("bf16",),
            dataset_files=(),
            dataset_bytes_per_sample=0,
            dataset_bytes_per_token=0,
            vocab_files=(VocabFile("frequency_d2t", "draft_vocab_cache/d2t{size}{pt}"),),
            loading="ModelOpt: `offline_data_path: <set>` (every `*.pt`; `conversation_id` is the dataset index, "
            "unique across hosts), `data.draft_vocab_cache: <set>/draft_vocab_cache/d2t.pth`.",
        ),
    )
}
FORMAT_NAMES: tuple[str, ...] = tuple(FORMATS)
DEFAULT_FORMAT = "speculators"  # the client's and the planner's (the roles' hsextract_format default too)
FINAL_HIDDEN_PLACEMENTS: tuple[str, ...] = ("post_norm", "pre_norm")
# The flag of the drain, the client and the plan (hsextract.options), declared once.
PRECISION_OPTION = Option(
    choices=PRECISIONS,
    help="how the training set stores the rows: bf16 as captured, or fp8 (float8_e4m3fn with one float32 scale "
    "per token: about half the bytes; only in a format whose trainer's reader reads FP8 rows: "
    f"{', '.join(n for n, s in FORMATS.items() if 'fp8' in s.precisions)}; default {DEFAULT_PRECISION})",
)

# How the capture stages the rows in /dev/shm (hsextract.capture.config's precision), for the commands
# that size staging (plan, check-shm): a run config's ``capture_precision``, as the roles write it.
CAPTURE_PRECISION_OPTION = Option(
    flag="--capture-precision",
    dest="capture_precision",
    choices=("bf16", "fp8"),
    help="how the capture stages the rows in the staging directory: bf16 as computed (the default), or fp8 "
    "(capture-patch --precision fp8: quantized on the server's device, about half the bytes a token)",
)


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


def check_dtype(fmt: str, dtype: str, *, where: str) -> None:
    """ConfigError unless the format's files hold states of `dtype`, naming `where` it came from."""
    from hsextract.errors import ConfigError

    held = format_spec(fmt).dtypes
    if dtype not in held:
        raise ConfigError(
            f"{where} has {dtype} states, which the format {fmt!r} does not hold (it holds {', '.join(held)})"
        )


def check_precision(fmt: str, precision: str) -> None:
    """ConfigError unless the format's released reader reads rows of `precision`, naming the formats
    whose readers do: a set its trainer would misread is never written."""
    from hsextract.errors import ConfigError

    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    spec = format_spec(fmt)
    if precision not in spec.precisions:
        readers = [name for name, s in FORMATS.items() if precision in s.precisions]
        back = (
            f" (a set of FP8 rows becomes {fmt} files with `hsextract pull --to-bf16 --format {fmt}` or "
            f"`hsextract collect --to-bf16 --format {fmt}`)"
            if precision == "fp8" and "bf16" in spec.precisions
            else ""
        )
        raise ConfigError(
            f"precision {precision}: the {fmt} format's reader ({spec.trainer}) reads "
            f"{', '.join(spec.precisions)} rows only; {precision} is read by: {', '.join(readers)}{back}"
        )


def get_format(name: str) -> Any:  # -> hsextract.formats.base.OutputFormat
    """The writer for a ``--format`` name (imported lazily: the writers pull in torch)."""
    return format_spec(name).load_writer()
