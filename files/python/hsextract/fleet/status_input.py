"""What the controller hands ``hsextract fleet status`` for each host, read without trusting its shape.

As for the plan (`hsextract.fleet.plan_input`, whose reasons hold here too): a host entry that is
not an object, or a status that is not the object ``hsextract status --json`` prints, or one whose
counts are not counts, never ends the fleet's status in a traceback. The host gets a row that
says "bad entry", and one problem line naming it and the field, which makes the fleet's status
not ok (exit 3) as a host's own failed check does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hsextract.fleet.plan_input import is_count, is_number, json_kind, shown
from hsextract.fleet.status import BUCKETS, HostStatus

ENTRY_FIELDS = "status and error"


def host_statuses(hosts: Mapping[str, Any]) -> list[HostStatus]:
    """Every host of the input as a HostStatus, in the input's order; never raises on an entry."""
    return [host_status(str(name), entry) for name, entry in hosts.items()]


def host_status(name: str, entry: Any) -> HostStatus:
    if not isinstance(entry, dict):
        return HostStatus(name, None, problem=f"its entry is {json_kind(entry)}, not an object with {ENTRY_FIELDS}")
    error = "" if entry.get("error") is None else str(entry["error"])
    status = entry.get("status")
    if status is None:
        return HostStatus(name, None, error)
    why = status_problem(status)
    return HostStatus(name, None, error, problem=why) if why else HostStatus(name, status, error)


# The status's numbers the fleet's table reads: (part, field, its test, what it must be).
NUMBERS = (
    ("client", "tokens_per_s", is_number, "a number"),
    ("client", "eta_s", is_number, "a number"),
    ("client", "failed", is_count, "a count"),
    ("drain", "written", is_count, "a count"),
    ("drain", "tokens_total", is_count, "a count"),
    ("drain", "quarantined", is_count, "a count"),
)


def status_problem(status: Any) -> str:
    """What makes `status` unusable as a host's ``hsextract status --json``, or ''."""
    if not isinstance(status, dict):
        return f"its status is {json_kind(status)}, not the object of `hsextract status --json`"
    if not isinstance(status.get("ok"), bool):
        return f"its status's ok is {shown(status.get('ok'))}, not true or false"
    for part in ("client", "drain", "accounts"):
        if status.get(part) is not None and not isinstance(status[part], dict):
            return f"its status's {part} is {json_kind(status[part])}, not an object"
    if not isinstance(status.get("problems") or [], list):
        return f"its status's problems is {json_kind(status['problems'])}, not a list"
    for part, name, good, what in NUMBERS:
        value = (status.get(part) or {}).get(name)
        if value is not None and not good(value):
            return f"its status's {part}.{name} is {shown(value)}, not {what}"
    return _accounts_problem(status.get("accounts"))


def _accounts_problem(accounts: dict[str, Any] | None) -> str:
    if accounts is None:
        return ""
    for k in BUCKETS:
        v = accounts.get(k)
        if not (is_count(v) or (isinstance(v, dict) and all(is_count(n) for n in v.values()))):
            return f"its status's accounts.{k} is {shown(v)}, not a count (or counts by reason)"
    return ""
