"""``hsextract reap-port``: stop the leftover servers that hold a TCP port, and nothing else.

A server that died badly (or an earlier run that was never torn down) keeps the port, and the new
server then fails with "address already in use" after minutes of model loading. This command finds
every process LISTENING on the port, checks that each one is what the caller expects (its command
line matches a pattern, e.g. an SGLang server), sends SIGTERM, waits, sends SIGKILL to whatever is
left, and verifies the port is free. It never signals pid 1, itself or its ancestors, never a
process that does not listen on the port, and if any holder does not match it stops nothing and
fails with that holder's pid and command line: killing an unknown service is worse than failing.

Output (stdout): one JSON object, Ansible-friendly: ``changed``, ``stopped`` (pid, cmdline, signal)
and ``port_free``. With ``--dry-run`` it reports what it would stop (``changed`` = would change).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass

from hsextract.config_file import add_config_argument
from hsextract.errors import ConfigError, HsextractError


class PortHeldError(HsextractError):
    """The port is held by a process this command must not (or could not) stop."""

    exit_code = 3


@dataclass(frozen=True)
class Holder:
    """A process that has a listening socket on the port (``pid`` None: owner not visible)."""

    pid: int | None
    cmdline: str
    address: str


@dataclass(frozen=True)
class Refusal:
    holder: Holder
    reason: str


@dataclass(frozen=True)
class ReapPlan:
    """What to stop and what forbids stopping anything (the plan is all-or-nothing)."""

    targets: tuple[Holder, ...]
    refusals: tuple[Refusal, ...]
    kept: tuple[Holder, ...] = ()


@dataclass(frozen=True)
class Stopped:
    pid: int
    cmdline: str
    signal: str  # the signal that ended it: SIGTERM or SIGKILL ("gone" if it exited on its own)


def plan_reap(
    holders: Iterable[Holder],
    pattern: re.Pattern[str],
    protected: set[int],
    keep: frozenset[int] | set[int] = frozenset(),
) -> ReapPlan:
    """Decide which holders may be stopped.

    One entry per pid (a process with several listening sockets, e.g. IPv4 and IPv6, is one target).
    Holders in ``keep`` (the running server of the project's own unit, re-run on a converged host)
    are left alone. A holder is refused when its owner is unknown, it is protected (pid 1, this
    process and its ancestors), or its command line does not match ``pattern``.
    """
    targets: dict[int, Holder] = {}
    refusals: list[Refusal] = []
    kept: dict[int, Holder] = {}
    for h in holders:
        if h.pid is not None and h.pid in keep:
            kept.setdefault(h.pid, h)
        elif h.pid is None:
            refusals.append(Refusal(h, "the owning process is not visible (another namespace, or not root)"))
        elif h.pid <= 1 or h.pid in protected:
            refusals.append(Refusal(h, "protected process (pid 1, this command or one of its parents)"))
        elif not pattern.search(h.cmdline):
            refusals.append(Refusal(h, f"its command line does not match the pattern {pattern.pattern!r}"))
        else:
            targets.setdefault(h.pid, h)
    seen: set[int | None] = set()
    unique_refusals = []
    for r in refusals:
        if r.holder.pid is None or r.holder.pid not in seen:
            unique_refusals.append(r)
            seen.add(r.holder.pid)
    return ReapPlan(tuple(targets.values()), tuple(unique_refusals), tuple(kept.values()))


def refusal_message(port: int, refusals: Sequence[Refusal]) -> str:
    lines = [f"port {port} is held by a process reap-port will not stop, so nothing was stopped:"]
    for r in refusals:
        lines.append(f"  pid {r.holder.pid} ({r.holder.cmdline or '?'}) listening on {r.holder.address}: {r.reason}")
    lines.append(
        "Fix: stop that process yourself, choose another port for the server, or widen --match if it really is "
        "a server of this project."
    )
    return "\n".join(lines)


# ---- adapters: the live system through psutil -------------------------------------------------


def _cmdline(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def find_holders(port: int) -> list[Holder]:
    """Every process with a LISTEN socket on ``port`` (TCP, IPv4 or IPv6, any address)."""
    import psutil

    holders = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        holders.append(Holder(conn.pid, _cmdline(conn.pid) if conn.pid else "", f"{conn.laddr.ip}:{conn.laddr.port}"))
    return holders


def protected_pids() -> set[int]:
    """pid 1, this process and all its ancestors (never signal the chain that runs us)."""
    import psutil

    pids = {1, os.getpid()}
    try:
        pids.update(p.pid for p in psutil.Process().parents())
    except psutil.Error:
        pids.add(os.getppid())
    return pids


def _gone(proc) -> bool:
    import psutil

    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(procs: list, timeout: float) -> list:
    """Wait until the processes exited (or are zombies awaiting their parent); return the survivors."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive:
        alive = [p for p in alive if not _gone(p)]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return alive


def stop_processes(targets: Sequence[Holder], term_timeout: float, kill_timeout: float) -> list[Stopped]:
    """SIGTERM every target, wait ``term_timeout``, SIGKILL the rest, wait ``kill_timeout``.

    psutil.Process objects are taken before signalling; psutil refuses to signal a pid that was
    reused by another process since, so a process that exits meanwhile is never confused with a new one.
    """
    import psutil

    procs, by_pid = [], {}
    for t in targets:
        try:
            p = psutil.Process(t.pid)
        except psutil.NoSuchProcess:
            continue
        procs.append(p)
        by_pid[p.pid] = t
    ended: dict[int, str] = {}
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            ended[p.pid] = "gone"
    survivors = _wait_gone([p for p in procs if p.pid not in ended], term_timeout)
    for p in procs:
        if p.pid not in ended and p not in survivors:
            ended[p.pid] = "SIGTERM"
    for p in survivors:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    still = _wait_gone(survivors, kill_timeout)
    if still:
        raise PortHeldError(
            "these processes survived SIGKILL (stuck in the kernel, e.g. uninterruptible GPU I/O): "
            + ", ".join(f"pid {p.pid} ({by_pid[p.pid].cmdline})" for p in still)
            + ". Fix: check the GPU driver state (nvidia-smi), or reboot the host."
        )
    for p in survivors:
        ended[p.pid] = "SIGKILL"
    return [Stopped(pid, by_pid[pid].cmdline, sig) for pid, sig in ended.items()]


def with_descendants(pids: Iterable[int]) -> set[int]:
    """The given pids plus every descendant (a kept server's workers are kept too)."""
    import psutil

    out = set()
    for pid in pids:
        out.add(pid)
        with contextlib.suppress(psutil.Error):
            out.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    return out


def reap_port(
    port: int,
    pattern: re.Pattern[str],
    *,
    keep: Iterable[int] = (),
    dry_run: bool = False,
    term_timeout: float = 30.0,
    kill_timeout: float = 10.0,
    free_timeout: float = 5.0,
    holders_of: Callable[[int], list[Holder]] = find_holders,
) -> dict:
    """Free ``port`` of matching listeners; return the JSON-able report. Raise PortHeldError otherwise."""
    keep_set = with_descendants(keep)
    plan = plan_reap(holders_of(port), pattern, protected_pids(), keep_set)
    if plan.refusals:
        raise PortHeldError(refusal_message(port, plan.refusals))
    report = {"port": port, "pattern": pattern.pattern, "dry_run": dry_run, "changed": bool(plan.targets)}
    if plan.kept:
        report["kept"] = [asdict(k) for k in plan.kept]
    if dry_run:
        report["would_stop"] = [asdict(t) for t in plan.targets]
        report["stopped"] = []
        report["port_free"] = not plan.targets and not plan.kept
        return report
    stopped = stop_processes(plan.targets, term_timeout, kill_timeout)
    report["stopped"] = [asdict(s) for s in stopped]
    deadline = time.monotonic() + free_timeout

    def others() -> list[Holder]:
        return [h for h in holders_of(port) if h.pid not in keep_set]

    while (left := others()) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        raise PortHeldError(
            f"port {port} is still held after stopping {[s.pid for s in stopped]}: "
            + "; ".join(f"pid {h.pid} ({h.cmdline})" for h in left)
            + ". Fix: a new server may have started meanwhile (is a service manager restarting it?); "
            "stop that unit first."
        )
    report["port_free"] = not plan.kept
    return report


# ---- CLI ----------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, required=True, help="TCP port to free")
    parser.add_argument(
        "--match",
        required=True,
        metavar="REGEX",
        help="regular expression a holder's command line must match to be stopped (e.g. 'sglang')",
    )
    parser.add_argument("--term-timeout", type=float, default=30.0, help="seconds to wait after SIGTERM (default 30)")
    parser.add_argument("--kill-timeout", type=float, default=10.0, help="seconds to wait after SIGKILL (default 10)")
    parser.add_argument(
        "--keep-pid",
        type=int,
        action="append",
        default=[],
        metavar="PID",
        help="leave this listener (and its children) alone: the project's own running server unit; repeatable",
    )
    parser.add_argument("--dry-run", action="store_true", help="report what would be stopped; signal nothing")
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port}: expected a TCP port in 1..65535")
    try:
        pattern = re.compile(args.match)
    except re.error as exc:
        raise ConfigError(f"--match {args.match!r}: not a valid regular expression ({exc})") from exc
    report = reap_port(
        args.port,
        pattern,
        keep=args.keep_pid,
        dry_run=args.dry_run,
        term_timeout=args.term_timeout,
        kill_timeout=args.kill_timeout,
    )
    print(json.dumps(report))
    return 0
