"""What ``hsextract plan`` is given: its flags, declared once (hsextract.options), as it reads them.

The fields keep the flags' own names and values (a shard as "i/n", a margin as "5%"): the plan reads
them as the client would read its own, in hsextract.plan.command.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hsextract.dataset import defaults
from hsextract.dataset.chat_template import OVERLONG_POLICIES
from hsextract.dataset.reader import MAX_ROW_BYTES_OPTION
from hsextract.formats import (
    CAPTURE_PRECISION_OPTION,
    DEFAULT_FORMAT,
    DEFAULT_PRECISION,
    FORMAT_NAMES,
    PRECISION_OPTION,
)
from hsextract.objectstore.settings import WORK_DIR_OPTION
from hsextract.options import option

WHAT = "what to plan"
SERVER = "the server's settings, where it is given them (they bound the longest prompt)"
STAGING = "staging (as check-shm, with the client's defaults)"
TIME_AND_ROOM = "time and room"


@dataclass
class PlanSettings:
    """The plan's flags, each field with its `option`, in ``--help``'s order and groups."""

    dataset: str = option(group=WHAT, help="the dataset the client will send")
    model: str = option(group=WHAT, help="the served model's directory (tokenizer, chat template, hidden size)")
    format: str | None = option(
        None,
        group=WHAT,
        choices=FORMAT_NAMES,
        help=f"the training set's format (default {DEFAULT_FORMAT}); "
        "bytes are printed for every format, the room check uses this one",
    )
    precision: str = option(DEFAULT_PRECISION, group=WHAT, like=PRECISION_OPTION)
    output: str | None = option(
        None,
        group=WHAT,
        help="the training set's directory: its volume is checked; samples it has are "
        "counted as written (s3://bucket/prefix: its --work-dir)",
    )
    work_dir: str | None = option(None, group=WHAT, like=WORK_DIR_OPTION)
    chat_template: str | None = option(
        None, group=WHAT, metavar="FILE", help="Jinja chat template instead of the tokenizer's"
    )
    shard: str = option("0/1", group=WHAT, help="this host's share, i/n (default 0/1)")
    max_tokens: int | None = option(
        None,
        group=WHAT,
        type=int,
        help=f"longest sample (default {defaults.MAX_TOKENS}, or the longest prompt the server runs if fewer)",
    )
    overlong: str = option(defaults.OVERLONG, group=WHAT, choices=OVERLONG_POLICIES)
    max_row_bytes: int = option(defaults.MAX_ROW_BYTES, group=WHAT, like=MAX_ROW_BYTES_OPTION)
    last_turn_only: bool = option(
        False, group=WHAT, action="store_true", help="the last assistant turn only (as the client)"
    )
    min_loss_tokens: int = option(0, group=WHAT, type=int, help="fewer loss tokens are a reject (as the client)")
    aux_layers: str | None = option(None, group=WHAT, help="aux layer ids; only their number matters here (default 3)")
    draft_vocab_size: list[int] = option(default_factory=lambda: [32000], group=WHAT, type=int, nargs="+", metavar="N")
    context_length: int | None = option(
        None, group=SERVER, type=int, help="its --context-length (default: the model's)"
    )
    max_total_tokens: int | None = option(
        None,
        group=SERVER,
        type=int,
        help="its --max-total-tokens, the KV pool's size (default: a pool that holds a whole context)",
    )
    dump_dir: str = option("/dev/shm", group=STAGING, help="the capture's staging directory (default /dev/shm)")
    max_in_flight: int = option(defaults.MAX_IN_FLIGHT, group=STAGING, type=int)
    max_staged: int = option(defaults.MAX_STAGED, group=STAGING, type=int)
    shm_min_free: str = option(defaults.SHM_MIN_FREE, group=STAGING)
    capture_precision: str = option("bf16", group=STAGING, like=CAPTURE_PRECISION_OPTION)
    tokens_per_s: float | None = option(
        None,
        group=TIME_AND_ROOM,
        type=float,
        help="prefill tokens/s of the server with the capture on (default: the GPU bench's, if found)",
    )
    bench_results: Path | None = option(
        None, group=TIME_AND_ROOM, type=Path, help="bench/results directory to take the rate from"
    )
    space_margin: str = option(
        "5%",
        group=TIME_AND_ROOM,
        help="room to keep free on the output volume beyond the estimate: a percentage or bytes",
    )
    no_space_check: bool = option(
        False, group=TIME_AND_ROOM, action="store_true", help="report, but do not fail when the volume is short"
    )
    measure_disk: bool = option(
        False,
        group=TIME_AND_ROOM,
        action="store_true",
        help="measure the output volume's ceiling with the drain's write pattern (a few seconds per "
        "writer count, up to --measure-disk-gb each, removed after) and say whether it or the GPU "
        "sets the pace",
    )
    measure_disk_seconds: float = option(
        2.0, group=TIME_AND_ROOM, type=float, help="seconds per writer count (default 2)"
    )
    measure_disk_gb: float = option(
        2.0, group=TIME_AND_ROOM, type=float, help="GB at most per writer count (default 2)"
    )
    workers: int | None = option(
        None, type=int, help="tokenizing processes (default: every core, one per 2000 rows at least)"
    )
    json: Path | None = option(
        None,
        type=Path,
        help="where to write the report as JSON, with the scan beside it for the next plan "
        "(default: <output>/.hsextract/plan.json; without --output, nowhere)",
    )
    no_progress: bool = option(False, action="store_true", help="no progress bar")
    rescan: bool = option(
        False,
        action="store_true",
        help="tokenize the dataset again even when the scan kept beside the report (REPORT.scan.json) "
        "is of the same dataset, model, sources and settings",
    )
