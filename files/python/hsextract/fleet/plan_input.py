"""What the controller hands ``hsextract fleet plan`` for each host, read without trusting its shape.

The input is built by a Jinja template on the controller from whatever each host returned, and
read by a person's script as often: a host entry may be null, a list, a report that is a string or
misses fields, an exit status written as a string. None of that may end the plan in a traceback
that names no host: every entry is read here into a `HostPlan`, and what cannot be used becomes one
line naming the host and the field (`HostPlan.problems`), which stops the fleet like any other
problem (exit 3). A report found wanting is not used (no totals, no dataset comparison); the shard
the controller gave the host still counts for the coverage when it can be read.

An exit status written as a decimal string ("5", as a template that stringifies may write it) is
read as its number: it says what the host's plan meant, and a host with no room must make the
fleet's plan exit 5 however it was written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hsextract.errors import ConfigError
from hsextract.fleet.plan import HostPlan, format_key, read_shard

ENTRY_FIELDS = "shard, report, rc and error"
# The fields of `hsextract plan --json` that the fleet's plan reads, in the order it reads them.
REPORT_FIELDS = (
    "dataset",
    "shard",
    "format",
    "rows",
    "samples",
    "tokens",
    "remaining_tokens",
    "dataset_fingerprint",
    "formats",
    "output_volume",
)
COUNT_FIELDS = ("rows", "samples", "tokens", "remaining_tokens")


def json_kind(value: Any) -> str:
    """How JSON names the type of `value`: null, a list, a string, a number, a boolean, an object."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def shown(value: Any, limit: int = 60) -> str:
    """`value` as the JSON it came in, cut to `limit` characters: what a problem line quotes."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def host_plans(hosts: Mapping[str, Any]) -> list[HostPlan]:
    """Every host of the input as a HostPlan, in the input's order; never raises on an entry."""
    return [host_plan(str(name), entry) for name, entry in hosts.items()]


def host_plan(name: str, entry: Any) -> HostPlan:
    """One host's entry read into a HostPlan, with a line for each field that cannot be used."""
    if not isinstance(entry, dict):
        return HostPlan(
            name, None, problems=(f"host {name}: its entry is {json_kind(entry)}, not an object with {ENTRY_FIELDS}",)
        )
    problems: list[str] = []
    shard = _shard(name, entry.get("shard"), problems)
    rc = _exit_status(name, entry.get("rc"), problems)
    report = entry.get("report")
    if report is not None:
        why = report_problem(report)
        if why:
            problems.append(f"host {name}: {why}")
            report = None
    error = entry.get("error")
    return HostPlan(name, shard, report, rc, "" if error is None else str(error), tuple(problems))


def _shard(name: str, value: Any, problems: list[str]) -> str | None:
    """The shard the controller gave the host ("" for the whole dataset); None when unreadable."""
    if value is None or value == "":
        return ""
    try:
        read_shard(value, f"host {name}")
    except ConfigError as exc:
        problems.append(str(exc))
        return None
    return str(value)


def _exit_status(name: str, value: Any, problems: list[str]) -> int | None:
    """The host's plan's exit status (None: it did not run); see the module docstring for strings."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, str) and value.strip().isdecimal():
        return int(value)
    problems.append(f"host {name}: its rc is {shown(value)}, not an exit status")
    return None


def report_problem(report: Any) -> str:
    """What makes `report` unusable as a host's `hsextract plan --json` report, or ''."""
    if not isinstance(report, dict):
        return f"its report is {json_kind(report)}, not the object of `hsextract plan --json`"
    missing = [k for k in REPORT_FIELDS if k not in report]
    if missing:
        return "its report lacks " + ", ".join(missing)
    for k in COUNT_FIELDS:
        if not is_count(report[k]):
            return f"its report's {k} is {shown(report[k])}, not a count"
    try:
        read_shard(report["shard"])
    except ConfigError as exc:
        return f"its report's {exc}"
    return _format_problem(report) or _volume_problem(report["output_volume"]) or _time_problem(report.get("time"))


def _format_problem(report: dict[str, Any]) -> str:
    formats = report["formats"]
    fmt = (
        format_key(report)
        if isinstance(report["format"], str) and isinstance(report.get("precision", ""), str)
        else None
    )
    entry = formats.get(fmt) if isinstance(formats, dict) and fmt is not None else None
    if not isinstance(entry, dict):
        return f"its report's formats has no entry for its format {shown(fmt or report['format'])}"
    if not is_count(entry.get("remaining_bytes")):
        return f"its report's formats.{fmt}.remaining_bytes is {shown(entry.get('remaining_bytes'))}, not a count"
    return ""


def _volume_problem(volume: Any) -> str:
    if not isinstance(volume, dict) or not isinstance(volume.get("ok"), bool) or not is_count(volume.get("free_bytes")):
        return f"its report's output_volume is {shown(volume)}, not an object with ok (true/false) and free_bytes"
    return ""


def _time_problem(when: Any) -> str:
    if when is not None and not isinstance(when, dict):
        return f"its report's time is {json_kind(when)}, not an object"
    seconds = (when or {}).get("seconds")
    if seconds is not None and not is_number(seconds):
        return f"its report's time.seconds is {shown(seconds)}, not a number of seconds"
    return ""
