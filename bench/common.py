"""What every bench records beside its numbers: the machine it ran on, so results stay comparable."""

from __future__ import annotations

import os
import platform


def machine_info() -> dict:
    """The bench's ``"machine"`` block: core count, platform, Python version and the load averages.

    Call it when the measurements are done: ``loadavg_at_end`` is the load at that moment, which says
    whether other work on a shared machine may have disturbed the run.
    """
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "loadavg_at_end": os.getloadavg()}
