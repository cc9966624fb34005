"""The drafter bench's stages in a process of their own, followed from one device call to the next.

A device call lasts at most ten minutes and the bench's stages take longer, but a process that
starts a new session outlives the call, while the machine is held (the next call must come within
its idle time). ``detach`` starts the stages so; ``follow`` prints their log from where the last
call left off, copies the results into ``$OUT``, and says whether the stages still run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PID, RC, OUTPUT, LOG, RESULTS, OFFSET = (
    "run.pid",
    "run.rc",
    "run.out",
    "drafter_gpu.log",
    "drafter_gpu.json",
    "follow.offset",
)
STILL_RUNNING = 3  # follow's exit status while the stages go on


def detach(work: Path, argv: list[str]) -> int:
    """Start ``python <argv>`` in a new session, its output in ``work/run.out`` and its exit status
    written to ``work/run.rc`` when it ends; return its pid."""
    work.mkdir(parents=True, exist_ok=True)
    for name in (RC, OFFSET):
        (work / name).unlink(missing_ok=True)
    script = f"{sys.executable} {' '.join(map(_quote, argv))}; echo $? > {_quote(str(work / RC))}"
    with open(work / OUTPUT, "ab") as out:
        proc = subprocess.Popen(["bash", "-c", script], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    (work / PID).write_text(str(proc.pid))
    return proc.pid


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def _new_lines(work: Path) -> str:
    log, offset_file = work / LOG, work / OFFSET
    if not log.is_file():
        return ""
    offset = int(offset_file.read_text()) if offset_file.is_file() else 0
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read()
    offset_file.write_text(str(offset + len(text)))
    return text.decode(errors="replace")


def _running(work: Path) -> bool:
    if (work / RC).is_file() or not (work / PID).is_file():
        return False
    try:
        os.kill(int((work / PID).read_text()), 0)
    except ProcessLookupError:
        return False
    return True


def copy_out(work: Path, names: tuple[str, ...] = (RESULTS, LOG)) -> None:
    """The results and the log into ``$OUT`` (where set), with the tail of the stages' own output."""
    out = os.environ.get("OUT")
    if not out:
        return
    for name in names:
        if (work / name).is_file():
            shutil.copyfile(work / name, Path(out) / name)
    if (work / OUTPUT).is_file():
        data = (work / OUTPUT).read_bytes()
        (Path(out) / OUTPUT).write_bytes(data[-4_000_000:])


def follow(work: Path, seconds: float) -> int:
    """Print the stages' new log lines for up to ``seconds``; 0 or their exit status once they ended,
    ``STILL_RUNNING`` if they go on (call again at once: the machine is held only while it is used)."""
    end = time.monotonic() + seconds
    while True:
        sys.stdout.write(_new_lines(work))
        sys.stdout.flush()
        running = _running(work)
        if not running or time.monotonic() > end:
            break
        time.sleep(2)
    copy_out(work)
    if running:
        print(f"the stages still run (pid {(work / PID).read_text()}): call follow again", flush=True)
        return STILL_RUNNING
    rc = int((work / RC).read_text().strip() or 1) if (work / RC).is_file() else 1
    print(f"the stages ended with exit status {rc}", flush=True)
    return rc
