"""How long ago this process started, by the kernel's record: the seconds a start-up spent before any
of our code ran (the interpreter and the imports) count too. The client times its start-up phases
from it (hsextract.client.startup) and the drain says when its worker processes were up
(hsextract.drain.worker_processes)."""

from __future__ import annotations

import os
from pathlib import Path

from hsextract.staging.announcements import process_start_ticks


def process_age_s() -> float | None:
    """Seconds since this process started, None where /proc cannot tell."""
    ticks = process_start_ticks(os.getpid())
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if ticks is None:
        return None
    return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
