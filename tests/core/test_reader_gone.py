"""A command whose reader stops reading (``hsextract status | head -1``) ends as a command killed by
SIGPIPE does: silently, with status 141, whichever subcommand it is and wherever its write fails
(inside the command, or at the interpreter's last flush).

The reader is gone before the command starts (the pipe's reading end is closed), so every write
to stdout fails, as the writes after ``head -1`` has read its line do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.drain_proc import env

pytestmark = pytest.mark.slow

EXIT_KILLED_BY_SIGPIPE = 128 + 13


def _run_with_reader_gone(*args: str) -> subprocess.CompletedProcess:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "hsextract", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=env(),
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)


@pytest.fixture
def run_output(tmp_path):
    """An output directory whose status is long enough to be written while the command runs."""
    state = tmp_path / "out" / ".hsextract"
    state.mkdir(parents=True)
    (state / "client-status.json").write_text(json.dumps({"state": "failed", "error": "x" * 20000}))
    return tmp_path / "out"


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--json"],  # 20 kB: written inside the command
        ["status"],
        ["check-shm", "--hidden-size", "64", "--dump-dir", "{tmp}"],  # a line, written at the last flush
    ],
    ids=["status-json", "status", "check-shm"],
)
def test_a_reader_that_stops_reading_ends_the_command_silently_as_sigpipe_would(run_output, tmp_path, args):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if argv[0] == "status":
        argv += ["--output", str(run_output)]
    r = _run_with_reader_gone(*argv)
    assert (r.returncode, r.stderr) == (EXIT_KILLED_BY_SIGPIPE, "")
