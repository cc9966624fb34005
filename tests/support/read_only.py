"""Run a command with some directories read-only, as a read-only volume or a copy on one is.

Tests run as root, and chmod does not stop root: the directories are bind-mounted read-only in a
private mount namespace (``unshare -m``) that lives as long as the command, so nothing outside
it sees the mounts and nothing is left mounted if the test fails.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from support.drain_proc import env


def hsextract_read_only(read_only: Sequence[Path], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``hsextract ARGS`` with every directory of `read_only` mounted read-only for it alone."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("read-only bind mounts need root and unshare(1)")
    mounts = [f"mount --bind -o ro {shlex.quote(str(d))} {shlex.quote(str(d))}" for d in read_only]
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "hsextract", *args])
    script = " && ".join([*mounts, f"exec {command}"])
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], env=env(), capture_output=True, text=True, timeout=timeout
    )
    if r.returncode != 0 and "mount:" in r.stderr:
        pytest.skip(f"cannot make a read-only bind mount here: {r.stderr.strip()}")
    return r
