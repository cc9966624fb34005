"""Each writing capture announces itself in the directory it stages into: what it writes, and how.

::

    <dump_dir>/_captures/<host>-<pid>.json

The client and the drain read the announcements at start and compare them with their own
settings, so a capture that stages elsewhere, or in the final-norm placement the format cannot
use, is refused before anything is lost (`hsextract.client.probe`, `hsextract.drain.recovery`).
A capture removes its announcement at its exit where it gets one; SGLang stops its schedulers
with SIGKILL, so the readers remove an announcement whose process is gone (`live_announcements`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hsextract.durable import atomic_write_bytes, pid_alive
from hsextract.staging.fs import FILE_MODE, make_dir, plain_name
from hsextract.staging.names import CAPTURES_DIR, captures_dir


@dataclass
class CaptureAnnouncement:
    """A writing capture's description of itself, in ``_captures/`` of the directory it writes to.

    The client and the drain compare it with their own settings at start, so a capture that writes
    elsewhere, or the wrong final-norm placement for the format, is refused before anything is lost.
    """

    dump_dir: str
    rid_prefix: str
    final_hidden: str
    format: str = ""  # the format the patch was rendered for ("" when it was not given)
    hidden_size: int = 0
    eagle_aux_hidden_state_layer_ids: list[int] = field(default_factory=list)
    architecture: str = ""
    host: str = ""
    pid: int = 0
    port: int = 0
    started_at: float = 0.0
    # The process's start time in clock ticks since boot (/proc/<pid>/stat): with the pid, it names
    # the process, where a pid alone may be reused by another one after it died. 0: not known.
    proc_start: int = 0
    precision: str = "bf16"  # how it stages the rows: "fp8" quantized on its device (hsextract.staging.dumps)

    @property
    def file_name(self) -> str:
        return f"{self.host}-{self.pid}.json"


def process_start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (field 22 of /proc/<pid>/stat); None if
    there is no such process (or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:  # the command name (field 2) is in parentheses and may hold spaces and parentheses
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def write_announcement(dump_dir: str | Path, ann: CaptureAnnouncement) -> Path:
    """Write `ann` into the dump dir's ``_captures/`` atomically: a reader sees all of it or none."""
    make_dir(dump_dir, CAPTURES_DIR)
    path = captures_dir(dump_dir) / plain_name(ann.file_name)
    # Not durable: the staging directory is a ramdisk, and a reboot ends the capture anyway.
    atomic_write_bytes(path, json.dumps(asdict(ann), sort_keys=True).encode(), durable=False, mode=FILE_MODE)
    return path


def remove_announcement(path: Path, pid: int) -> None:
    """Remove an announcement at the exit of the process that wrote it (`pid`): a process forked
    from it, which inherits its exit handlers, leaves it alone."""
    if os.getpid() == pid:
        with contextlib.suppress(OSError):
            path.unlink()


def live_announcements(dump_dir: str | Path) -> list[CaptureAnnouncement]:
    """The captures that announced themselves in ``dump_dir`` and still run.

    An announcement of this host whose process is gone (no process of that pid, or one started at
    another time: the pid was reused) is left behind by a capture that could not remove it (SGLang
    stops its schedulers with SIGKILL): it is removed here, so it misleads nobody later.
    """
    host = socket.gethostname()
    out = []
    for p in sorted(captures_dir(dump_dir).glob("*.json")):
        try:
            data = json.loads(p.read_text())
            known = CaptureAnnouncement.__dataclass_fields__
            ann = CaptureAnnouncement(**{k: v for k, v in data.items() if k in known})
        except (OSError, ValueError, TypeError):
            continue
        if ann.host == host and not announced_process_alive(ann):
            with contextlib.suppress(OSError):
                p.unlink()
            continue
        out.append(ann)
    return out


def announced_process_alive(ann: CaptureAnnouncement) -> bool:
    """Whether the process that wrote `ann` (on this host) still runs: its pid, started when it says."""
    if ann.pid <= 0:
        return False
    started = process_start_ticks(ann.pid)
    if started is None:
        return pid_alive(ann.pid)  # no /proc: the pid alone
    return not ann.proc_start or started == ann.proc_start
