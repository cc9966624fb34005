"""``hsextract fleet plan|status``: the hosts' own reports judged as one run.

The input (a file, or ``-`` for stdin) is one JSON object, which ``extract.yml`` and
``playbooks/status.yml`` build on the controller from what every host of the group returned::

    {"group": "hsextract", "hosts": {"<host>": {"shard": "0/2", "report": {...} | null,
                                                 "rc": 0 | null, "error": ""}}}            (plan)
    {"group": "hsextract", "hosts": {"<host>": {"status": {...} | null, "error": ""}}}  (status)

where ``report`` is the host's ``hsextract plan --json`` report and ``status`` its
``hsextract status --json``. Prints lines a person reads; ``--json`` prints one JSON object
instead, and ``--write FILE`` keeps it in a file as well. Exit status: 0 when all is well, 3 when
a host stops the fleet (plan) or the fleet's status is not ok, 5 when a host's volume cannot hold
its shard (plan).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hsextract.durable import atomic_write_bytes
from hsextract.errors import ConfigError
from hsextract.fleet import plan as fleet_plan
from hsextract.fleet import status as fleet_status

EXIT_PROBLEM = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=("plan", "status"),
                        help="plan: every host's plan as one run; status: every host's progress as one table")
    parser.add_argument("input", nargs="?", default="-",
                        help="the hosts' reports as one JSON object (default -: stdin)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--write", type=Path, metavar="FILE", help="also write the JSON object to FILE")


def _read_input(source: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"fleet input {source}: not readable as JSON ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), dict):
        raise ConfigError(f"fleet input {source}: expected an object with \"hosts\": {{host: ...}}")
    return data


def run(args: argparse.Namespace) -> int:
    data = _read_input(args.input)
    group = str(data.get("group") or "hsextract")
    hosts = data["hosts"]
    if args.what == "plan":
        plan = fleet_plan.plan_fleet(group, [
            fleet_plan.HostPlan(name, str(h.get("shard") or ""), h.get("report"), h.get("rc"),
                                str(h.get("error") or "")) for name, h in hosts.items()])
        result, lines, ok = plan.as_dict(), fleet_plan.render(plan), not plan.problems
        code = 0 if ok else (fleet_plan.EXIT_NO_ROOM if plan.no_room else EXIT_PROBLEM)
    else:
        fs = fleet_status.fleet_status(group, [
            fleet_status.HostStatus(name, h.get("status"), str(h.get("error") or "")) for name, h in hosts.items()])
        result, lines, code = fs.as_dict(), fleet_status.render(fs), 0 if fs.ok else EXIT_PROBLEM
    text = json.dumps(result, indent=2)
    if args.write:
        atomic_write_bytes(args.write, (text + "\n").encode(), durable=False)
    print(text if args.json else "\n".join(lines))
    return code
