"""The fleet's plan: every host's own plan judged as one run, before anything starts.

Each host sizes its shard with ``hsextract plan`` (its report: samples, tokens, bytes, room on
its output volume, the dataset's fingerprint). A fleet can make one training set only when every
host can hold its shard, every host reads the same dataset (the same fingerprint and rows, so
that dataset index x is the same row everywhere), and the shards cover the dataset exactly once
(hsextract.collect.shards). Any of these failing is a problem that stops every host before any
starts: a short volume or a stale dataset copy found after hours of extraction costs the whole
run. A host with no report (unreachable, or failed before its plan) is not a problem: it takes
no part until it is back, and the plan says so.

A host's report must be of the shard the controller gave it: a plan of another shard (a stale
``hsextract_shard``, a report left from another layout of the fleet) sizes samples the host will not
extract, and two such reports can pass for a dataset covered once while counting it twice. An entry
the controller could not fill in properly is read by `hsextract.fleet.plan_input`, which turns each
unusable field into a problem naming the host and the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hsextract.collect.shards import check_coverage
from hsextract.errors import ConfigError
from hsextract.shard import WHOLE, Shard
from hsextract.units import binary_size, duration

EXIT_NO_ROOM = 5  # as `hsextract plan`: a host's volume cannot hold its shard


@dataclass(frozen=True)
class HostPlan:
    """What the controller knows of one host's plan: its shard, its report, or why it has none."""

    name: str
    shard: str | None  # "i/n" the controller gave it; "" for the whole dataset; None when unreadable
    report: dict[str, Any] | None = None
    rc: int | None = None  # the plan's exit status; None when it did not run
    error: str = ""  # the plan's one-line error when it failed
    # What of its entry could not be used, one line each naming the host and the field
    # (hsextract.fleet.plan_input); the report is None when it was one of them.
    problems: tuple[str, ...] = ()

    @property
    def shard_text(self) -> str:
        return "?" if self.shard is None else self.shard or "0/1"


@dataclass
class FleetPlan:
    group: str
    hosts: list[HostPlan]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    no_room: bool = False

    @property
    def planned(self) -> list[HostPlan]:
        return [h for h in self.hosts if h.report is not None]

    def totals(self) -> dict[str, Any]:
        reports = [h.report for h in self.planned if h.report is not None]
        seconds = [r["time"]["seconds"] for r in reports if r.get("time", {}).get("seconds") is not None]
        return {
            "hosts": len(self.hosts),
            "planned": len(reports),
            "samples": sum(r["samples"] for r in reports),
            "tokens": sum(r["tokens"] for r in reports),
            "remaining_tokens": sum(r["remaining_tokens"] for r in reports),
            "remaining_bytes": sum(_format_bytes(r) for r in reports),
            # The hosts extract at once: the fleet takes as long as its slowest host.
            "seconds": max(seconds) if seconds and len(seconds) == len(reports) else None,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "ok": not self.problems,
            "problems": self.problems,
            "notes": self.notes,
            "totals": self.totals(),
            "hosts": {
                h.name: {
                    "shard": h.shard_text,
                    "rc": h.rc,
                    "error": h.error,
                    "report": h.report,
                    "problems": list(h.problems),
                }
                for h in self.hosts
            },
        }


def read_shard(text: object, where: str = "") -> Shard:
    """A host's shard as the controller or its report gives it: ``i/n``, "" for the whole dataset;
    a ConfigError that says what is wrong, prefixed by `where` (e.g. ``host b``), when it is neither."""
    return WHOLE if text == "" else Shard.parse(text, where)


def _same_shard(a: str, b: str) -> bool:
    """Whether two shard texts name one shard (both readable); an unreadable one is reported elsewhere."""
    try:
        return read_shard(a) == read_shard(b)
    except ConfigError:
        return False


def _format_bytes(report: dict[str, Any]) -> int:
    return int(report["formats"][format_key(report)]["remaining_bytes"])


def format_key(report: dict[str, Any]) -> str:
    """The report's own entry of its `formats`: its format in its precision (a report from before the
    precision, bf16)."""
    from hsextract.plan.report import bytes_key

    return bytes_key(report["format"], report.get("precision") or "bf16")


def _dataset_problems(planned: list[HostPlan]) -> list[str]:
    """Every planned host reads the first planned host's dataset: the same fingerprint and rows."""
    out: list[str] = []
    ref = planned[0]
    assert ref.report is not None
    for h in planned[1:]:
        assert h.report is not None
        if h.report.get("dataset_fingerprint") != ref.report.get("dataset_fingerprint"):
            out.append(
                f"host {h.name} reads another dataset than host {ref.name}: {h.report['dataset']} differs "
                f"from {ref.report['dataset']} in its first bytes (dataset fingerprint). Every host of a "
                "fleet must read the same dataset: copy the same file to each (hsextract_dataset_src)"
            )
        elif h.report["rows"] != ref.report["rows"]:
            out.append(
                f"host {h.name} reads {h.report['rows']:,} rows of {h.report['dataset']}, host {ref.name} "
                f"{ref.report['rows']:,} of {ref.report['dataset']}: one of them has a copy cut short or "
                "grown; copy the same file to each (hsextract_dataset_src)"
            )
    return out


def _host_problems(plan: FleetPlan, h: HostPlan) -> None:
    """What one host's own entry says: a problem of its entry, no room, a failed plan, no plan at all,
    a report of another shard than it was given."""
    plan.problems += h.problems
    if h.rc == EXIT_NO_ROOM:
        plan.no_room = True
        plan.problems.append(f"host {h.name} cannot hold its shard {h.shard_text}: {h.error}")
    elif h.rc:
        plan.problems.append(f"host {h.name}: its plan failed (exit status {h.rc}): {h.error}")
    elif h.report is None and h.rc is None and not h.problems:
        plan.notes.append(
            f"host {h.name}: not planned (unreachable, or it failed before its plan); its shard "
            f"{h.shard_text} waits until the play runs again with it"
        )
    elif h.report is None and not h.problems:
        plan.problems.append(
            f"host {h.name}: its plan exited 0 but no report of it came back, so its room and its "
            "dataset are not checked"
        )
    if h.report is not None and h.shard is not None and not _same_shard(h.report["shard"], h.shard):
        plan.problems.append(
            f"host {h.name}: its plan sized shard {h.report['shard']}, but the controller gave it "
            f"shard {h.shard_text}: its numbers are not its share; plan it again with its shard "
            "(hsextract_shard)"
        )


def plan_fleet(group: str, hosts: list[HostPlan]) -> FleetPlan:
    """Judge the hosts' plans as one run (see the module docstring)."""
    if not hosts:
        raise ConfigError(f"group {group!r} has no hosts")
    plan = FleetPlan(group, hosts)
    shards: dict[str, list[Shard]] = {}
    unknown = []
    for h in hosts:
        try:
            if h.shard is None:
                unknown.append(h.name)
            else:
                shards[h.name] = [read_shard(h.shard, f"host {h.name}")]
        except ConfigError as exc:
            unknown.append(h.name)
            if not h.problems:
                plan.problems.append(str(exc))
        _host_problems(plan, h)
    planned = plan.planned
    if planned:
        plan.problems += _dataset_problems(planned)
    if unknown:
        plan.notes.append(
            f"the shards' coverage of the dataset is not judged: the shard of {', '.join(unknown)} is not known"
        )
        return plan
    lines = planned[0].report["rows"] if planned and planned[0].report else 0
    cov = check_coverage(shards, lines) if lines else check_coverage(shards, _period(shards))
    plan.problems += [
        "the hosts' shards do not cover the dataset: " + m.replace("is in no host output", "is taken by no host")
        for m in cov.missing
    ]
    plan.problems += [f"the hosts' shards overlap: {d}" for d in cov.doubled]
    return plan


def _period(shards: dict[str, list[Shard]]) -> int:
    return math.lcm(*(s.count for ss in shards.values() for s in ss))


def render(plan: FleetPlan) -> list[str]:
    """The fleet's plan as lines a person reads: one row per host, the fleet's, then the verdict."""
    head = planned_dataset(plan)
    out = [f"fleet plan: {len(plan.hosts)} hosts of group {plan.group}{head}"]
    rows = [("host", "shard", "samples", "tokens", "to write", "output volume", "time")]
    for h in plan.hosts:
        r = h.report
        if r is None:
            why = "bad entry" if h.problems else "not planned" if h.rc is None else "plan failed"
            rows.append((h.name, h.shard_text, "-", "-", "-", why, "-"))
            continue
        v = r["output_volume"]
        room = f"{'room' if v['ok'] else 'NOT ENOUGH'}: {binary_size(v['free_bytes'])} free"
        rows.append(
            (
                h.name,
                r["shard"],
                f"{r['samples']:,}",
                f"{r['tokens']:,}",
                binary_size(_format_bytes(r)),
                room,
                duration(r.get("time", {}).get("seconds")),
            )
        )
    t = plan.totals()
    rows.append(
        (
            "fleet",
            "",
            f"{t['samples']:,}",
            f"{t['tokens']:,}",
            binary_size(t["remaining_bytes"]),
            "",
            duration(t["seconds"]),
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    out += [f"  note: {n}" for n in plan.notes]
    if plan.problems:
        out += [f"  PROBLEM {p}" for p in plan.problems]
    else:
        out.append("  the shards cover the dataset exactly once; every planned host reads it and can hold its shard")
    return out


def planned_dataset(plan: FleetPlan) -> str:
    planned = plan.planned
    if not planned or planned[0].report is None:
        return ""
    r = planned[0].report
    return f", dataset {r['dataset']} ({r['rows']:,} rows)"
