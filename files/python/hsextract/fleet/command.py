"""``hsextract fleet plan|status``: the hosts' own reports judged as one run.

The input (a file, or ``-`` for stdin) is one JSON object, which ``extract.yml`` and
``playbooks/status.yml`` build on the controller from what every host of the group returned::

    {"group": "hsextract", "hosts": {"<host>": {"shard": "0/2", "report": {...} | null,
                                                 "rc": 0 | null, "error": ""}}}            (plan)
    {"group": "hsextract", "hosts": {"<host>": {"status": {...} | null, "error": ""}}}  (status)

where ``report`` is the host's ``hsextract plan --json`` report and ``status`` its
``hsextract status --json``. Prints lines a person reads; ``--json`` prints one JSON object
instead, and ``--write FILE`` keeps it in a file as well.

A host entry that cannot be used (not an object, a report or status of the wrong shape, an exit
status that is not one) is one problem line naming the host and the field, never a traceback
(`hsextract.fleet.plan_input`, `hsextract.fleet.status_input`).

Exit status: 0 when all is well; 5 (plan) when a host's volume cannot hold its shard (its plan
exited 5, whatever else is wrong: the first thing to fix is the most expensive one, a volume);
3 for every other problem that stops the fleet (plan: a malformed entry, a failed plan, another
dataset, a report of another shard, shards that miss or double part of the dataset) or when the
fleet's status is not ok; 2 when the input as a whole is not one JSON object with ``hosts``.
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
from hsextract.fleet.plan_input import host_plans
from hsextract.fleet.status_input import host_statuses

EXIT_PROBLEM = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "what",
        choices=("plan", "status"),
        help="plan: every host's plan as one run; status: every host's progress as one table",
    )
    parser.add_argument(
        "input", nargs="?", default="-", help="the hosts' reports as one JSON object (default -: stdin)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--write", type=Path, metavar="FILE", help="also write the JSON object to FILE")


def _read_input(source: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"fleet input {source}: not readable as JSON ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), dict):
        raise ConfigError(f'fleet input {source}: expected an object with "hosts": {{host: ...}}')
    return data


def run(args: argparse.Namespace) -> int:
    data = _read_input(args.input)
    group = str(data.get("group") or "hsextract")
    hosts = data["hosts"]
    if args.what == "plan":
        plan = fleet_plan.plan_fleet(group, host_plans(hosts))
        result, lines, ok = plan.as_dict(), fleet_plan.render(plan), not plan.problems
        code = 0 if ok else (fleet_plan.EXIT_NO_ROOM if plan.no_room else EXIT_PROBLEM)
    else:
        fs = fleet_status.fleet_status(group, host_statuses(hosts))
        result, lines, code = fs.as_dict(), fleet_status.render(fs), 0 if fs.ok else EXIT_PROBLEM
    text = json.dumps(result, indent=2)
    if args.write:
        atomic_write_bytes(args.write, (text + "\n").encode(), durable=False)
    print(text if args.json else "\n".join(lines))
    return code
