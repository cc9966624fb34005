"""``hsextract status --output O``: how far a run is, from the drain's and the client's status files.

Exits non-zero when the drain's status is missing or stale (its daemon stopped writing it while
claiming to run), or when a finished run's counts do not add up or too many of its samples
failed (see hsextract.reconcile), so a monitoring check or an Ansible task can act on the exit
code alone.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from hsextract.config_file import add_config_argument
from hsextract.errors import ConfigError
from hsextract.reconcile import DEFAULT_MAX_FAILURE_SHARE, Accounts, read_accounts

DRAIN_STATUS = "drain-status.json"
CLIENT_STATUS = "client-status.json"
FINISHED_STATES = ("done", "stopped")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", help="training-set directory of the run")
    parser.add_argument("--stale-after", type=float, default=60.0,
                        help="seconds after which a running drain's status counts as stale (default 60)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--max-failure-share", type=float, default=DEFAULT_MAX_FAILURE_SHARE,
                        help="share of accepted samples that may end failed, and quarantined, in a finished run "
                             f"(default {DEFAULT_MAX_FAILURE_SHARE:g})")
    add_config_argument(parser)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def drain_health(drain: dict[str, Any] | None, stale_after: float, now: float) -> tuple[bool, str]:
    """(ok, why): ok if the drain reported recently, or reported that it finished."""
    if drain is None:
        return False, "no drain status file (is the drain running?)"
    age = now - float(drain.get("updated_at", 0))
    if drain.get("state") in FINISHED_STATES:
        return True, f"drain {drain.get('state')} {age:.0f} s ago"
    if drain.get("state") == "failed":
        return False, f"drain failed: {drain.get('error', '?')}"
    if age > stale_after:
        return False, f"drain status is stale: last update {age:.0f} s ago (limit {stale_after:.0f} s)"
    return True, f"drain {drain.get('state')}, updated {age:.0f} s ago"


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def run_accounts(output: Path, drain: dict[str, Any] | None) -> Accounts | None:
    """The run's reconciliation; final once the client has finished and the drain has caught up."""
    caught_up = bool(drain) and not drain.get("lag") and not drain.get("in_flight")
    quarantine = Path(drain["quarantine_dir"]) if drain and drain.get("quarantine_dir") else None
    accounts = read_accounts(output, quarantine)
    if accounts is not None and accounts.final and not caught_up:
        accounts = read_accounts(output, quarantine, final=False)
    return accounts


def render(drain: dict[str, Any] | None, client: dict[str, Any] | None, health: tuple[bool, str]) -> str:
    lines = [("OK   " if health[0] else "FAIL ") + health[1]]
    if drain:
        lines.append(
            f"drain   {drain.get('format', '?')}: {drain.get('samples_total', 0)} samples in the set "
            f"({drain.get('samples', 0)} by this process, {drain.get('tokens', 0)} tokens, "
            f"{_human_bytes(drain.get('bytes', 0))}); {drain.get('samples_per_s', 0)} samples/s, "
            f"{drain.get('mb_per_s', 0)} MB/s; lag {drain.get('lag', 0)} staged; "
            f"quarantined {drain.get('quarantined', 0)}; stale removed {drain.get('stale_removed', 0)}"
        )
        if drain.get("paused_reason"):
            lines.append(f"drain   PAUSED: {drain['paused_reason']}")
    if client:
        lines.append("client  " + ", ".join(f"{k}={v}" for k, v in client.items()))
    else:
        lines.append("client  no status file yet")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if not args.output:
        raise ConfigError("status needs --output (on the command line or in --config)")
    sdir = Path(args.output) / ".hsextract"
    drain = _read(sdir / DRAIN_STATUS)
    client = _read(sdir / CLIENT_STATUS)
    health = drain_health(drain, args.stale_after, time.time())
    accounts = run_accounts(Path(args.output), drain)
    problems = accounts.problems(args.max_failure_share) if accounts else []
    ok = health[0] and not problems
    if args.json:
        print(json.dumps({"ok": ok, "why": health[1], "problems": problems, "drain": drain, "client": client,
                          "accounts": accounts.as_dict() if accounts else None}, indent=2))
    else:
        print(render(drain, client, health))
        if accounts:
            print("\n".join(f"counts  {line}" for line in accounts.lines_of_text()))
        for problem in problems:
            print(f"FAIL    {problem}")
    return 0 if ok else 1
