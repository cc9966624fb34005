"""The fleet's progress: every host's ``hsextract status --json`` as one table, its totals and the
fleet's reconciliation.

Each host reconciles its own shard (hsextract.output.accounts). Summed over the fleet, the hosts' shard
lines must be the dataset's lines once every host reports (the shards cover the dataset exactly
once: hsextract.fleet.plan checked that before the run), and the sums keep the host identities::

    dataset lines = accepted + rejected
    accepted = in the hosts' sets + failed + quarantined (+ on the way while the run goes on)

A host that does not answer (unreachable) or has no status yet is a row that says so; it makes
the fleet's status not ok, as a host's own failed check does, and never hides the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hsextract.units import count, duration

BUCKETS = ("lines", "accepted", "rejected", "in_set", "failed", "quarantined", "on_the_way")


@dataclass(frozen=True)
class HostStatus:
    """What the controller got from one host: its status (``hsextract status --json``) or why none."""

    name: str
    status: dict[str, Any] | None = None
    error: str = ""  # "unreachable", or the status command's complaint
    problem: str = ""  # what of its entry could not be used (hsextract.fleet.status_input); status is None


@dataclass
class HostRow:
    name: str
    state: str
    accepted: int | None
    in_set: int | None
    tokens: int | None
    tokens_per_s: float | None
    eta_s: float | None
    failed: int | None
    quarantined: int | None
    ok: bool
    why: str
    accounts: dict[str, int] | None
    dataset_lines: int | None


@dataclass
class FleetStatus:
    group: str
    rows: list[HostRow]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def totals(self) -> dict[str, Any]:
        def total(attr: str) -> int | float | None:
            values = [getattr(r, attr) for r in self.rows if getattr(r, attr) is not None]
            return sum(values) if values else None

        etas = [r.eta_s for r in self.rows if r.state == "running"]
        known = [e for e in etas if e is not None]
        return {
            "accepted": total("accepted"),
            "in_set": total("in_set"),
            "tokens": total("tokens"),
            "tokens_per_s": total("tokens_per_s"),
            "failed": total("failed"),
            "quarantined": total("quarantined"),
            # The hosts run at once: the fleet is done when its last host is.
            "eta_s": None if len(known) < len(etas) else max(known, default=0.0),
            "done": all(r.state == "done" for r in self.rows),
        }

    def reconciliation(self) -> dict[str, Any]:
        reporting = [r.accounts for r in self.rows if r.accounts is not None]
        sums = {k: sum(a[k] for a in reporting) for k in BUCKETS}
        lines = {r.dataset_lines for r in self.rows if r.dataset_lines is not None}
        return {
            **sums,
            "hosts_reporting": len(reporting),
            "hosts": len(self.rows),
            "dataset_lines": lines.pop() if len(lines) == 1 else None,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "ok": self.ok,
            "problems": self.problems,
            "hosts": {r.name: {k: v for k, v in vars(r).items() if k != "name"} for r in self.rows},
            "totals": self.totals(),
            "reconciliation": self.reconciliation(),
        }


def _sum(value: Any) -> int:
    """A count the accounts give as a number or as counts by reason."""
    return sum(value.values()) if isinstance(value, dict) else int(value or 0)


def _dataset_lines(status: dict[str, Any]) -> int | None:
    """The dataset's size as the host's finished client counted it (None while it runs)."""
    lines = status.get("dataset_lines")
    return lines if isinstance(lines, int) else None


def host_row(h: HostStatus) -> HostRow:
    if h.problem:
        return HostRow(h.name, "bad entry", None, None, None, None, None, None, None, False, h.problem, None, None)
    if h.status is None:
        return HostRow(
            h.name,
            h.error or "no status",
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            False,
            h.error or "no status",
            None,
            None,
        )
    st = h.status
    client, drain, acc = st.get("client") or {}, st.get("drain") or {}, st.get("accounts")
    accounts = {k: _sum(acc[k]) for k in BUCKETS} if acc else None
    state = str(client.get("state") or ("waiting for its client" if drain else "no status"))
    return HostRow(
        h.name,
        state,
        accepted=accounts["accepted"] if accounts else None,
        in_set=accounts["in_set"] if accounts else drain.get("written"),
        tokens=drain.get("tokens_total"),
        tokens_per_s=float(client["tokens_per_s"]) if state == "running" and "tokens_per_s" in client else 0.0,
        eta_s=0.0 if state == "done" else client.get("eta_s"),
        failed=accounts["failed"] if accounts else client.get("failed"),
        quarantined=accounts["quarantined"] if accounts else drain.get("quarantined"),
        ok=bool(st.get("ok")),
        why="; ".join([str(st.get("why", "")), *map(str, st.get("problems") or [])]),
        accounts=accounts,
        dataset_lines=_dataset_lines(st),
    )


def fleet_status(group: str, hosts: list[HostStatus]) -> FleetStatus:
    """One row per host, and what keeps the fleet from being ok (see the module docstring)."""
    fs = FleetStatus(group, [host_row(h) for h in hosts])
    for r in fs.rows:
        if not r.ok:
            fs.problems.append(f"host {r.name}: {r.why}")
    rec = fs.reconciliation()
    complete = rec["hosts_reporting"] == rec["hosts"] and rec["dataset_lines"] is not None
    if complete and rec["lines"] != rec["dataset_lines"]:
        fs.problems.append(
            f"the hosts' shards hold {rec['lines']} lines of a {rec['dataset_lines']}-line "
            "dataset: a shard is missing or taken twice (hsextract fleet plan says which)"
        )
    if rec["accepted"] != rec["in_set"] + rec["failed"] + rec["quarantined"] + rec["on_the_way"]:
        fs.problems.append("the hosts' accounts do not add up (see each host's own status)")
    return fs


def render(fs: FleetStatus) -> list[str]:
    """The fleet's table, its totals, its reconciliation, and what is wrong."""
    rows = [("host", "state", "samples", "tokens", "rate", "ETA", "failed", "quarantined")]
    for r in fs.rows:
        samples = f"{count(r.in_set)} of {count(r.accepted)}" if r.accepted is not None else count(r.in_set)
        rows.append(
            (
                r.name,
                r.state,
                samples,
                count(r.tokens),
                _rate(r.tokens_per_s),
                "done" if r.state == "done" else duration(r.eta_s),
                count(r.failed),
                count(r.quarantined),
            )
        )
    t = fs.totals()
    rows.append(
        (
            "fleet",
            "done" if t["done"] else "",
            f"{count(t['in_set'])} of {count(t['accepted'])}",
            count(t["tokens"]),
            _rate(t["tokens_per_s"]),
            "done" if t["done"] else duration(t["eta_s"]),
            count(t["failed"]),
            count(t["quarantined"]),
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = [f"fleet {fs.group}: {len(fs.rows)} hosts"]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    rec = fs.reconciliation()
    of = f" (of {rec['hosts_reporting']} of {rec['hosts']} hosts)" if rec["hosts_reporting"] < rec["hosts"] else ""
    lines = rec["dataset_lines"] if rec["dataset_lines"] is not None and not of else rec["lines"]
    out.append(f"  fleet: {lines} dataset lines = {rec['accepted']} accepted + {rec['rejected']} rejected{of}")
    way = f" + {rec['on_the_way']} on the way" if rec["on_the_way"] else ""
    out.append(
        f"  fleet: {rec['accepted']} accepted = {rec['in_set']} in the hosts' sets + {rec['failed']} failed + "
        f"{rec['quarantined']} quarantined{way}"
    )
    out += [f"  PROBLEM {p}" for p in fs.problems]
    return out


def _rate(tokens_per_s: float | None) -> str:
    return "-" if tokens_per_s is None else f"{count(tokens_per_s)} tok/s"
