"""What a collect is asked to do, what it did, and what it answers (shared by the runner and the report)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsextract.collect.admit import Admission, Reference
from hsextract.collect.failures import FailureJournal
from hsextract.collect.report_file import CollectReport
from hsextract.collect.selection import Selection
from hsextract.output.manifest import ManifestEntry

# Fetching is mostly waiting for disks and the network filesystem: a few threads keep them busy.
DEFAULT_WORKERS = max(1, min(4, os.cpu_count() or 1))


@dataclass
class CollectConfig:
    into: Path
    hosts: list[tuple[str, Path]]  # (name, host output), in the order given
    mode: str = "copy"  # copy | link | move
    final: bool = False
    wait_for_space_s: float = 0.0
    workers: int = DEFAULT_WORKERS
    draft_vocab_sizes: tuple[int, ...] | None = (32000,)  # None: no draft vocabulary
    vocab_size: int | None = None
    stale_after_s: float = 60.0


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
