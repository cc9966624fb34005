"""What a collect is asked to do, what it did, and what it answers (shared by the runner and the report).

``hsextract collect``'s flags are the fields of `CollectConfig`, declared once (hsextract.options):
hsextract.collect.command builds it from them, and the runner reads it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsextract.collect.admit import Admission, Reference
from hsextract.collect.failures import FailureJournal
from hsextract.collect.hosts import parse_host_argument
from hsextract.collect.report_file import CollectReport
from hsextract.collect.selection import Selection
from hsextract.formats import FORMAT_NAMES
from hsextract.options import option
from hsextract.output.manifest import ManifestEntry

# Fetching is mostly waiting for disks and the network filesystem: a few threads keep them busy.
DEFAULT_WORKERS = max(1, min(4, os.cpu_count() or 1))
TRANSFER = "how the samples come over"  # --link and --move: one or neither


def host_outputs(texts: Sequence[str]) -> list[tuple[str, Path]]:
    """``[NAME=]HOST_OUTPUT`` arguments as (name, host output), in the order given."""
    return [parse_host_argument(text) for text in texts]


def at_least_zero(seconds: float) -> float:
    return max(0.0, float(seconds))


@dataclass
class CollectConfig:
    """What a collect runs with: its flags (each field with an `option`, in ``--help``'s order), and
    the draft vocabulary's settings (hsextract.vocab.arguments, shared with the drain and finalize)."""

    into: Path = option(
        help="the collected set's directory (created; collecting again adds what is new), "
        "or s3://bucket/prefix: the hosts' s3:// prefixes merged in place, by "
        "server-side copies (docs/object-store.md)",
        convert=Path,
    )
    # (name, host output), in the order given
    hosts: list[tuple[str, Path]] = option(
        default_factory=list,
        positional=True,
        nargs="*",
        metavar="[NAME=]HOST_OUTPUT",
        help="each host's output directory (the drain's --output, or rsync's copy of it); NAME "
        "defaults to the directory's name. After --draft-vocab-size, put them after --",
        convert=host_outputs,
    )
    link: bool = option(
        False,
        action="store_true",
        exclusive=TRANSFER,
        help="hard-link the hosts' sample files instead of copying them (no space used; the host "
        "outputs must be on the collected set's filesystem, else it is refused)",
    )
    move: bool = option(
        False,
        action="store_true",
        exclusive=TRANSFER,
        help="move the hosts' sample files (a hard link on one filesystem, else a copy; each host "
        "file is removed once its sample is committed); refused for a host a drain runs on",
    )
    to_bf16: bool = option(
        False,
        action="store_true",
        help="write the samples of hosts whose sets hold FP8 rows (--precision fp8) as bf16 files, dequantized "
        "as the trainer's reader does (each verified; not with --link), in the format of --format; the "
        "collected set is then a bf16 set whatever the hosts' precision",
    )
    format: str | None = option(
        None,
        choices=FORMAT_NAMES,
        help="with --to-bf16: the format of the bf16 files (default: the hosts' own, speculators); specforge, "
        "modelopt and speculators-v1 are read by trainers that read bf16 rows only",
    )
    model: Path | None = option(
        None,
        help="with --to-bf16 --format specforge or modelopt: the hosts' model directory, whose final norm turns "
        "the pre-norm final state of FP8 rows into the post-norm one those formats hold",
        convert=Path,
    )
    final: bool = option(
        False,
        action="store_true",
        help="the last collect of the run: refuse a host whose client has not finished or whose "
        "drain has not caught up with it, and fail (exit 3) unless the shards cover the "
        "dataset exactly once and every sample is accounted for",
    )
    wait_for_space_s: float = option(
        0.0,
        flag="--wait-for-space",
        type=float,
        metavar="SECONDS",
        help="when the collected set's volume is full, say so and retry every SECONDS "
        "(default 0: stop with the numbers, exit 5; run it again once there is room)",
        convert=at_least_zero,
    )
    workers: int = option(
        DEFAULT_WORKERS, type=int, help="samples fetched and verified at once (default: one per core, at most 4)"
    )
    stale_after_s: float = option(
        60.0,
        flag="--stale-after",
        type=float,
        metavar="SECONDS",
        help="a host drain's status older than this no longer counts as a drain at work (default 60)",
    )
    draft_vocab_sizes: tuple[int, ...] | None = (32000,)  # None: no draft vocabulary
    vocab_size: int | None = None

    @property
    def mode(self) -> str:
        """How the hosts' sample files come over: copy, link or move."""
        return "link" if self.link else "move" if self.move else "copy"


@dataclass
class Collected:
    """What the collect found and did, for the bookkeeping, the accounts and the report."""

    cfg: CollectConfig
    ref: Reference
    fmt: Any  # hsextract.formats.base.OutputFormat, None when no host has samples yet
    entries: list[ManifestEntry]
    admission: Admission
    plan: Selection = field(default_factory=Selection)
    new: int = 0
    notes: list[str] = field(default_factory=list)
    journal: FailureJournal | None = None


@dataclass
class CollectResult:
    exit_code: int
    collected_now: int
    total: int
    lines: list[str] = field(default_factory=list)  # what a person reads, in order
    report: CollectReport | None = None  # None: nothing was collected, no report was written
