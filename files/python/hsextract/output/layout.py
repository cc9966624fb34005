"""Where every file of a run lives: the one owner of the names inside an output directory.

The client, the drain, ``hsextract status``, the reconciliation, the planner, the regeneration
and the Ansible roles all read files the others write; a name spelled twice drifts. So every
module asks this one for a path, and tests/core/test_layout.py holds the roles' literal copies
equal to it.

::

    <output>/
      manifest.json, manifest.jsonl     the training set's manifest (hsextract.output.manifest)
      run.json                          the run id, created once per output directory
      conversations.jsonl               hsextract regenerate's output
      quarantine/<rid>/                 the drain's default quarantine: reason.txt, source.json, record.json
                                        (in a collected set: those three and host.json, the host it came from)
      README.md, reader_order.json      a collected set's dataset card, and SpecForge's reading order
      .hsextract/                       the project's own bookkeeping
        client-status.json, client-summary.json, rejects.jsonl, failures.jsonl   the client of the whole dataset's
        client-status.shard-<i>-of-<n>.json, ...   the same four files of a client of shard i/n (n > 1)
        output.lock                     held by the training set's writer (the drain, finalize)
        client-<i>-of-<n>.lock, clients.lock   held by the client of each shard (hsextract.output.lock)
        drain-status.json, tmp/, arrow-build-<id>/, vocab_counts.json
        finalized.json                  how many samples the dataset-level files cover (hsextract.output.finalized)
        dataset.json                    which dataset the training set was extracted from (the client's)
        plan.json
        output.lock                     held by the process that writes the set (hsextract collect)
        collect-tmp/, collect-failures.jsonl, collect-report.json, collect-state.json   hsextract collect's
        regen-status.json, regen-summary.json, regen-errors.jsonl, regen-settings.json

The staging directory's names are hsextract.staging.names's.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from hsextract.errors import ConfigError
from hsextract.shard import WHOLE, Shard

# <output>/
MANIFEST_HEADER = "manifest.json"
MANIFEST_ENTRIES = "manifest.jsonl"
RUN_FILE = "run.json"
REGEN_OUTPUT = "conversations.jsonl"
QUARANTINE_DIR = "quarantine"  # the drain's default --quarantine-dir
STATE_DIR = ".hsextract"

# <output>/.hsextract/
CLIENT_STATUS = "client-status.json"
CLIENT_SUMMARY = "client-summary.json"
REJECTS = "rejects.jsonl"
FAILURES = "failures.jsonl"  # the samples the client gave up on, one JSON object with "rid" per line
DRAIN_STATUS = "drain-status.json"
DRAIN_TMP_DIR = "tmp"
ARROW_BUILD_PREFIX = "arrow-build-"
FINALIZED = "finalized.json"  # the samples the dataset-level files were last written for (hsextract.output.finalized)
VOCAB_CHECKPOINT = "vocab_counts.json"  # never ends in "pt": some readers take every such file
DATASET_RECORD = "dataset.json"  # the dataset the client extracts into this output (hsextract.output.dataset_record)
PLAN = "plan.json"
COLLECT_TMP_DIR = "collect-tmp"
COLLECT_FAILURES = "collect-failures.jsonl"  # samples a collect could not verify: the same lines as FAILURES, plus host
COLLECT_REPORT = "collect-report.json"
COLLECT_STATE = "collect-state.json"
REGEN_STATUS = "regen-status.json"
REGEN_SUMMARY = "regen-summary.json"
REGEN_ERRORS = "regen-errors.jsonl"
REGEN_SETTINGS = "regen-settings.json"
OUTPUT_LOCK = "output.lock"  # hsextract.output.lock: the drain's (and finalize's) exclusive lock
CLIENTS_LOCK = "clients.lock"  # ... held for a moment while a client checks the other shards' locks
CLIENT_LOCK_RE = r"client-(?P<i>\d+)-of-(?P<n>\d+)\.lock"  # ... and each client's lock on its shard
# A client of shard i/n (n > 1) writes its status, summary, rejects and failures under names of its
# own, so that clients of disjoint shards of one output never write each other's files; the client
# of the whole dataset (0/1) keeps the plain names above.
SHARD_TAG_RE = r"\.shard-(?P<i>\d+)-of-(?P<n>\d+)"

# <quarantine>/<rid>/
QUARANTINE_REASON = "reason.txt"  # first line: the reason code; then the detail
QUARANTINE_SOURCE = "source.json"  # which staged dump it is a copy of
QUARANTINE_RECORD = "record.json"  # the client's record of the sample, if it had one
QUARANTINE_HOST = "host.json"  # in a collected set: which host output quarantined it

# <collected set>/
DATASET_CARD = "README.md"
READER_ORDER = "reader_order.json"  # SpecForge's reading order of a collected set (hsextract.collect.order)


def state_dir(output: str | Path) -> Path:
    """``<output>/.hsextract``: the project's bookkeeping, never read by a trainer."""
    return Path(output) / STATE_DIR


def manifest_header_path(output: str | Path) -> Path:
    return Path(output) / MANIFEST_HEADER


def manifest_entries_path(output: str | Path) -> Path:
    return Path(output) / MANIFEST_ENTRIES


def run_file_path(output: str | Path) -> Path:
    return Path(output) / RUN_FILE


def default_quarantine_dir(output: str | Path) -> Path:
    return Path(output) / QUARANTINE_DIR


@dataclass(frozen=True)
class ProblemFiles:
    """Where the details of each kind of problem are listed (what a person's screen points at)."""

    rejected: str  # dataset lines the client could not use (JSON lines)
    failed: str  # samples the client gave up on (JSON lines)
    quarantined: str  # the quarantine directory: <rid>/reason.txt for each


def problem_files(
    output: str | Path, quarantine_dir: str | Path | None = None, shards: list[Shard] | None = None
) -> ProblemFiles:
    """The files that list a run's rejected, failed and quarantined samples (of one client's
    shard, or a pattern for the files of several)."""
    quarantine = str(quarantine_dir or default_quarantine_dir(output))
    if shards is not None and len(shards) > 1:
        return ProblemFiles(
            rejected=_every_shard(output, REJECTS), failed=_every_shard(output, FAILURES), quarantined=quarantine
        )
    shard = shards[0] if shards else WHOLE
    return ProblemFiles(
        rejected=str(rejects_path(output, shard)), failed=str(failures_path(output, shard)), quarantined=quarantine
    )


def _every_shard(output: str | Path, base: str) -> str:
    """``<output>/.hsextract/rejects*.jsonl``: the files of that kind of every shard's client."""
    stem, _, ext = base.partition(".")
    return str(state_dir(output) / f"{stem}*.{ext}")


def regen_output_path(output: str | Path) -> Path:
    return Path(output) / REGEN_OUTPUT


def shard_tag(shard: Shard = WHOLE) -> str:
    """What a client file's name carries of its shard: nothing for the whole dataset, else ``.shard-i-of-n``."""
    return "" if shard == WHOLE else f".shard-{shard.index}-of-{shard.count}"


def _tagged(name: str, shard: Shard) -> str:
    stem, dot, ext = name.partition(".")
    return f"{stem}{shard_tag(shard)}{dot}{ext}"


def client_status_path(output: str | Path, shard: Shard = WHOLE) -> Path:
    return state_dir(output) / _tagged(CLIENT_STATUS, shard)


def client_summary_path(output: str | Path, shard: Shard = WHOLE) -> Path:
    return state_dir(output) / _tagged(CLIENT_SUMMARY, shard)


def rejects_path(output: str | Path, shard: Shard = WHOLE) -> Path:
    return state_dir(output) / _tagged(REJECTS, shard)


def failures_path(output: str | Path, shard: Shard = WHOLE) -> Path:
    return state_dir(output) / _tagged(FAILURES, shard)


def shard_in_name(match: re.Match[str] | None) -> Shard | None:
    """The shard a match of ``SHARD_TAG_RE`` or ``CLIENT_LOCK_RE`` names; None when there is no
    match or it names no shard that can exist (``-3-of-2``: no file hsextract writes)."""
    if match is None:
        return None
    try:
        return Shard(int(match["i"]), int(match["n"]))
    except ConfigError:
        return None


def client_file_shard(name: str, base: str) -> Shard | None:
    """The shard a client file of kind `base` (``CLIENT_STATUS``, ``REJECTS``...) is named for, or
    None if `name` is no such file."""
    stem, _, ext = base.partition(".")
    m = re.fullmatch(re.escape(stem) + f"(?:{SHARD_TAG_RE})?" + re.escape("." + ext), name)
    if not m:
        return None
    return shard_in_name(m) if m["n"] else WHOLE


def client_files(output: str | Path, base: str) -> dict[Shard, Path]:
    """Every client file of kind `base` in the output directory, by the shard its name carries."""
    out: dict[Shard, Path] = {}
    try:
        names = sorted(os.listdir(state_dir(output)))
    except FileNotFoundError:
        return out
    for name in names:
        shard = client_file_shard(name, base)
        if shard is not None:
            out[shard] = state_dir(output) / name
    return out


def output_lock_path(output: str | Path) -> Path:
    return state_dir(output) / OUTPUT_LOCK


def clients_registry_path(output: str | Path) -> Path:
    return state_dir(output) / CLIENTS_LOCK


def client_lock_path(output: str | Path, shard: Shard) -> Path:
    return state_dir(output) / f"client-{shard.index}-of-{shard.count}.lock"


def drain_status_path(output: str | Path) -> Path:
    return state_dir(output) / DRAIN_STATUS


def drain_tmp_dir(output: str | Path) -> Path:
    return state_dir(output) / DRAIN_TMP_DIR


def finalized_path(output: str | Path) -> Path:
    return state_dir(output) / FINALIZED


def arrow_build_dir(output: str | Path, build_id: str) -> Path:
    return state_dir(output) / f"{ARROW_BUILD_PREFIX}{build_id}"


def vocab_checkpoint_relpath() -> str:
    """The checkpoint's path relative to the output directory (the drain writes it with a sample)."""
    return f"{STATE_DIR}/{VOCAB_CHECKPOINT}"


def vocab_checkpoint_path(output: str | Path) -> Path:
    return state_dir(output) / VOCAB_CHECKPOINT


def dataset_record_path(output: str | Path) -> Path:
    return state_dir(output) / DATASET_RECORD


def plan_path(output: str | Path) -> Path:
    return state_dir(output) / PLAN


def collect_tmp_dir(output: str | Path) -> Path:
    return state_dir(output) / COLLECT_TMP_DIR


def collect_failures_path(output: str | Path) -> Path:
    return state_dir(output) / COLLECT_FAILURES


def collect_report_path(output: str | Path) -> Path:
    return state_dir(output) / COLLECT_REPORT


def collect_state_path(output: str | Path) -> Path:
    return state_dir(output) / COLLECT_STATE


def regen_status_path(output: str | Path) -> Path:
    return state_dir(output) / REGEN_STATUS


def regen_summary_path(output: str | Path) -> Path:
    return state_dir(output) / REGEN_SUMMARY


def regen_errors_path(output: str | Path) -> Path:
    return state_dir(output) / REGEN_ERRORS


def regen_settings_path(output: str | Path) -> Path:
    return state_dir(output) / REGEN_SETTINGS
