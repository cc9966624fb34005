"""Run `hsextract drain` (and friends) as the real command, in a subprocess, as systemd would."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIR = REPO / "files" / "python"


def drain_status(out: Path) -> dict:
    """The drain's status file of the output `out`, or {} while there is none (or it is being replaced)."""
    with contextlib.suppress(OSError, ValueError):
        return json.loads((out / ".hsextract" / "drain-status.json").read_text())
    return {}


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_DIR), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


# A command's time before the test gives up on it: above an object-store command's own retries of one
# request (10 attempts of 30 s, tests/support/s3_server.CLIENT_READ_TIMEOUT_S, and 91.5 s of backoff),
# so a server that stops answering for a while is met by the product's retries and its own error.
COMMAND_TIMEOUT_S = 420


def hsextract(*args: str, timeout: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hsextract", *args], env=env(), capture_output=True, text=True, timeout=timeout
    )


def drain_args(dump: Path, out: Path | str, fmt: str, *extra: str) -> list[str]:
    """``hsextract drain``'s arguments for a staging directory, an output (a directory, or an
    ``s3://`` URL as a string) and a format, then `extra`."""
    return ["drain", "--dump-dir", str(dump), "--output", str(out), "--format", fmt, *extra]


def start(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hsextract", *args], env=env(), text=True, **kw)


def finish_client(output: Path, lines: int) -> None:
    """What the client writes when every sample of its `lines`-line dataset was sent and answered:
    its summary, which the drain's --exit-when-done waits for and checks the run's counts against."""
    d = Path(output) / ".hsextract"
    d.mkdir(parents=True, exist_ok=True)
    summary = {"state": "done", "dataset_lines": lines, "shard": [0, 1], "finished_at": time.time()}
    (d / "client-summary.json").write_text(json.dumps(summary))


def drain_until_done(
    dump: Path, output: Path, fmt: str, *extra: str, lines: int, expect_rc: int = 0, timeout: float = 180
) -> subprocess.CompletedProcess:
    finish_client(output, lines)
    r = hsextract(
        "drain",
        "--dump-dir",
        str(dump),
        "--output",
        str(output),
        "--format",
        fmt,
        "--exit-when-done",
        "--poll-interval",
        "0.1",
        *extra,
        timeout=timeout,
    )
    assert r.returncode == expect_rc, f"drain exited {r.returncode}, expected {expect_rc}:\n{r.stderr[-4000:]}"
    return r
