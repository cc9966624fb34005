"""Interrupt a fleet host's run at a chosen point, from the host itself (run in a transient unit).

Usage: python3 fleet_interrupts.py stop-units OUTPUT COUNT REPORT UNIT...
       python3 fleet_interrupts.py kill-collect INTO REPORT

They run on the host, started before the play that reaches the point, because the point passes
faster than a test can reach into a host: a host of the test fleet writes its dozen samples in
about three seconds, and a command from the test into its sandbox takes a second or more to land.

* stop-units stops UNITs the moment OUTPUT's manifest holds COUNT samples (polled every
  millisecond): the host is stopped a few samples into its shard, whatever the machine's load.
* kill-collect holds the ``hsextract collect --into INTO`` at the point it means: it freezes the
  collect as it starts (SIGSTOP), takes a write lease (``F_SETLEASE``) on the last sample the
  collect will fetch (the highest dataset index of its sources: a first collect into an empty set,
  which fetches every sample in one batch and commits none before the whole batch is fetched),
  lets it go on, and SIGKILLs it once it has fetched every other sample and waits in its open of
  the leased file (the kernel holds an open of a leased file until the holder lets go, up to
  /proc/sys/fs/lease-break-time). Nothing is committed and every other sample is fetched, every
  time; the sample itself is never changed. (A FIFO in its place no longer holds it: collect
  refuses a sample that is not a regular file.)

Each writes REPORT (JSON) last, after it has put back what it changed, so that a test that reads
the report finds the host as the run left it. Only the standard library: it runs with the host's
/usr/bin/python3, outside the ml-env.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

POLL_S = 0.001
TIMEOUT_S = 900.0


def _report(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def stop_units(output: Path, count: int, report: Path, units: list[str]) -> None:
    """Stop `units` the moment `output`'s manifest holds `count` samples."""
    manifest = output / "manifest.jsonl"
    deadline = time.monotonic() + TIMEOUT_S
    while (lines := _lines(manifest)) < count:
        if time.monotonic() > deadline:
            _report(report, {"error": f"{manifest} held {lines} samples after {TIMEOUT_S:.0f} s, not {count}"})
            return
        time.sleep(POLL_S)
    subprocess.run(["systemctl", "stop", *units], check=True)
    _report(report, {"lines_at_stop": lines})


def _collect_pid(into: Path) -> tuple[int, list[bytes]] | None:
    """The running ``hsextract collect --into INTO`` and its argv, if there is one."""
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"hsextract" in argv and b"collect" in argv and b"--into" in argv and str(into).encode() in argv:
            return int(p), argv
    return None


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie, killed and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _last_sample(argv: list[bytes]) -> tuple[Path, int]:
    """The file of the collect's last sample (its sources' highest dataset index; the sources are
    the NAME=PATH arguments after ``--``) and how many samples the sources hold."""
    sources = [Path(a.decode().partition("=")[2]) for a in argv[argv.index(b"--") + 1 :] if a]
    entries = [
        json.loads(line) | {"source": src}
        for src in sources
        for line in (src / "manifest.jsonl").read_text().splitlines()
    ]
    last = max(entries, key=lambda e: e["dataset_index"])
    return last["source"] / last["file"], len(entries)


def kill_collect(into: Path, report: Path) -> None:
    """Kill the collect into `into` with every sample but its last fetched and none committed."""
    tmp_dir, deadline = into / ".hsextract" / "collect-tmp", time.monotonic() + TIMEOUT_S
    while (found := _collect_pid(into)) is None:
        if time.monotonic() > deadline:
            _report(report, {"error": f"no hsextract collect --into {into} started in {TIMEOUT_S:.0f} s"})
            return
        time.sleep(POLL_S)
    pid, argv = found
    signal.signal(signal.SIGIO, lambda *_: None)  # the kernel's word that an open waits on the lease
    os.kill(pid, signal.SIGSTOP)
    try:
        sample, samples = _last_sample(argv)
        lease = os.open(sample, os.O_RDONLY)
        fcntl.fcntl(lease, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        # Its temporary file (a hard link to the sample) is made before the sample is opened: the
        # collect waits in that open until the lease is let go.
        waiting = tmp_dir / f"{samples - 1}.tmp"
        while _alive(pid) and not waiting.exists() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        held_there = waiting.exists()
        with contextlib.suppress(ProcessLookupError):  # it finished (the hold came too late)
            os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(POLL_S)
        fetched = len([n for n in os.listdir(tmp_dir) if n.endswith(".tmp")]) - 1 if held_there else 0
        lines = _lines(into / "manifest.jsonl")
    finally:
        fcntl.fcntl(lease, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        os.close(lease)
    _report(
        report, {"held": held_there, "fetched_at_kill": fetched, "lines_at_kill": lines, "samples": samples, "pid": pid}
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["stop-units"] and len(argv) >= 5:
        stop_units(Path(argv[1]), int(argv[2]), Path(argv[3]), argv[4:])
    elif argv[:1] == ["kill-collect"] and len(argv) == 3:
        kill_collect(Path(argv[1]), Path(argv[2]))
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
