"""``hsextract status --output O``: how far a run is, from the drain's and the client's status files.

Exits non-zero when the drain's status is missing or stale (its daemon stopped writing it while
claiming to run), or when a finished run's counts do not add up or too many of its samples
failed (see hsextract.output.accounts), so a monitoring check or an Ansible task can act on the exit
code alone. A set made by ``hsextract collect`` has no drain: its status comes from its own files
(hsextract.status_collected).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from hsextract.collect.report_file import read_collect_report
from hsextract.config_file import add_config_argument
from hsextract.errors import ConfigError
from hsextract.objectstore.output import resolve_output
from hsextract.objectstore.settings import add_work_dir_argument
from hsextract.output.accounts import DEFAULT_MAX_FAILURE_SHARE, Accounts, read_accounts
from hsextract.output.client_files import ShardFiles, combined_status, read_shards
from hsextract.output.commit_timeline import CommitTimeline, client_end, commit_timeline
from hsextract.output.finalized import finalized_samples
from hsextract.output.layout import (
    problem_files,
)
from hsextract.output.manifest import iter_entries
from hsextract.output.run_files import DrainStatus, read_drain_status
from hsextract.report import RunView, status_lines
from hsextract.status_collected import collected_view, print_collected_status
from hsextract.status_report import StatusReport
from hsextract.units import duration

FINISHED_STATES = ("done", "stopped")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", help="training-set directory of the run, or its s3://bucket/prefix (with the drain's --work-dir)"
    )
    add_work_dir_argument(parser)
    parser.add_argument(
        "--stale-after",
        type=float,
        default=60.0,
        help="seconds after which a running drain's status counts as stale (default 60)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--max-failure-share",
        type=float,
        default=DEFAULT_MAX_FAILURE_SHARE,
        help="share of accepted samples that may end failed, and quarantined, in a finished run "
        f"(default {DEFAULT_MAX_FAILURE_SHARE:g})",
    )
    add_config_argument(parser)


def drain_health(drain: DrainStatus | None, stale_after: float, now: float) -> tuple[bool, str]:
    """(ok, why): ok if the drain reported recently, or reported that it finished."""
    if drain is None:
        return False, "no drain status file (is the drain running?)"
    age = now - float(drain.updated_at or 0)
    if drain.state in FINISHED_STATES:
        return True, f"drain {drain.state} {duration(age)} ago"
    if drain.state == "failed":
        return False, f"drain failed: {'?' if drain.error is None else drain.error}"
    if age > stale_after:
        return False, f"drain status is stale: last update {duration(age)} ago (limit {duration(stale_after)})"
    return True, f"drain {drain.state}, updated {duration(age)} ago"


def run_accounts(output: Path, drain: DrainStatus | None) -> Accounts | None:
    """The run's reconciliation; final once the client has finished and the drain has caught up."""
    caught_up = drain is not None and not drain.lag and not drain.in_flight
    quarantine = Path(drain.quarantine_dir) if drain and drain.quarantine_dir else None
    accounts = read_accounts(output, quarantine)
    if accounts is not None and accounts.final and not caught_up:
        accounts = read_accounts(output, quarantine, final=False)
    return accounts


def dataset_files(output: str | Path, drain: DrainStatus | None) -> tuple[int, int] | None:
    """(samples the dataset-level files cover, samples in the set), where the drain's status says
    how many are in the set and the drain records finalizes (hsextract.output.finalized); else None."""
    if drain is None or not drain.has("finalized_samples"):
        return None  # no drain yet, or one of a version that did not record them: not known
    return finalized_samples(output) or 0, drain.samples_total or 0


def dataset_files_problem(output: str | Path, drain: DrainStatus | None, files: tuple[int, int] | None) -> str:
    """The problem of a drain that has finished with the dataset-level files behind the set, or ''.
    A running drain writes them when idle or when the run is over: not a problem yet."""
    if files is None or files[0] == files[1] or drain is None or drain.state not in FINISHED_STATES:
        return ""
    why = drain.finalize_problem or f"run `hsextract finalize --output {output}`"
    return (
        f"the dataset-level files (the format's, the draft vocabulary's) cover {files[0]} of the {files[1]} "
        f"samples in the set, so a trainer would not read the others: {why}"
    )


def bucket_problem(drain: DrainStatus | None, now: float) -> str:
    """The problem of a drain whose bucket's server does not answer (it waits), or ''."""
    store = (drain.objectstore if drain else None) or {}
    since = float(store.get("unreachable_since") or 0)
    if not since or (drain is not None and drain.state in FINISHED_STATES):
        return ""
    at = time.strftime("%H:%M:%S", time.localtime(since))
    return (
        f"the object store {store.get('url', '?')} has not answered for {duration(now - since)} (since {at}): the "
        "drain waits and retries, nothing staged is lost, and the client pauses when staging fills"
    )


def start_refusal(client: dict[str, Any] | None) -> str:
    """The problem of a client whose last start was refused, or ''."""
    refused = (client or {}).get("start_refused")
    if not isinstance(refused, dict):
        return ""
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(refused.get("at") or 0)))
    return f"the client's start at {at} was refused: {refused.get('error') or '?'}"


def run_timeline(output: Path, shards: list[ShardFiles], drain: DrainStatus | None) -> CommitTimeline:
    """The drain's commits against the clients' end (hsextract.output.commit_timeline), with the
    self-check's queue from the drain's status."""
    queue = ((drain.selfcheck if drain else None) or {}).get("queue")
    return commit_timeline(iter_entries(output), client_end(shards), queue if isinstance(queue, dict) else None)


def dataset_lines(shards: list[ShardFiles]) -> int | None:
    """The dataset's size as the finished clients counted it; None until one has, or when they disagree."""
    lines = {s.summary.dataset_lines for s in shards if s.summary}
    return lines.pop() if len(lines) == 1 else None


def run(args: argparse.Namespace) -> int:
    if not args.output:
        raise ConfigError("status needs --output (on the command line or in --config)")
    shown = str(args.output)
    args.output = resolve_output(args.output, args)[0]  # a bucket's run is seen in its work directory
    drain = read_drain_status(args.output)
    collected = read_collect_report(args.output) if drain is None else None
    if collected is not None:  # a set made by hsextract collect: no drain writes it
        return print_collected_status(
            collected_view(Path(args.output), collected, problem_files(args.output), args.max_failure_share), args.json
        )
    shards = read_shards(args.output)
    client = combined_status(shards)
    now = time.time()
    health = drain_health(drain, args.stale_after, now)
    accounts = run_accounts(Path(args.output), drain)
    problems = accounts.problems(args.max_failure_share) if accounts else []
    refusal = start_refusal(client)
    if refusal:
        problems = [refusal, *problems]
    unreachable = bucket_problem(drain, now)
    if unreachable:
        problems = [unreachable, *problems]
    files = dataset_files(args.output, drain)
    timeline = run_timeline(Path(args.output), shards, drain)
    behind = dataset_files_problem(args.output, drain, files)
    if behind:
        problems = [*problems, behind]
    ok = health[0] and not problems
    if args.json:
        report = StatusReport(
            ok=ok,
            why=health[1],
            problems=problems,
            drain=drain,
            client=client,
            dataset_lines=dataset_lines(shards),
            accounts=accounts,
            dataset_files=files,
            commits=timeline,
        )
        print(json.dumps(report.to_json(), indent=2))
    else:
        view = RunView(
            output=shown,
            files=problem_files(args.output, drain.quarantine_dir if drain else None, [s.shard for s in shards]),
            drain=drain.to_json() if drain else None,
            client=client,
            healthy=health[0],
            health=health[1],
            now=now,
            problems=problems,
            counts=accounts.lines_of_text() if accounts else [],
            accounts=accounts.as_dict() if accounts else None,
            dataset_files=files,
            commits=timeline.to_json(),
        )
        print("\n".join(status_lines(view)))
    return 0 if ok else 1
