"""The collected set's lock: one collect writes a collected set at a time.

Two collects into one set would give two samples the same output index. The lock is an
exclusive ``flock`` on ``.hsextract/output.lock``, the drain's own lock (`hsextract.output.lock`),
so a collect into a directory a drain writes is refused too. The kernel releases it when its holder
dies (kill -9 included), so a collect killed mid-copy never leaves the set locked. The holder
writes who it is into the file, so the refusal names it.

`held_by_a_process` answers, without taking anything, whether some process holds the lock of a
host output (the drain that still writes it): it reads the kernel's table of locks, so it
cannot make a drain starting at that instant fail to get its own lock.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from hsextract.errors import HsextractError
from hsextract.output.layout import output_lock_path
from hsextract.output.lock import OutputBusy, OutputLock, read_holder


class SetBusy(HsextractError):
    """Another process writes the collected set."""

    exit_code = 75  # sysexits.h EX_TEMPFAIL: run it again once the other one has finished


@contextlib.contextmanager
def collected_set_lock(out: Path) -> Iterator[None]:
    """Hold the collected set's lock (the output lock every writer of a training set takes:
    `hsextract.output.lock.OutputLock`) for the block, or raise SetBusy naming the holder."""
    try:
        lock = OutputLock(out, "collect").acquire()
    except OutputBusy:
        holder = read_holder(output_lock_path(out))
        who = f"hsextract {holder.role} (pid {holder.pid} on {holder.host})" if holder else "another process"
        raise SetBusy(
            f"the collected set {out} is in use by {who}: one process writes it at a time. Wait for that "
            "one to finish, or collect into another --into"
        ) from None
    try:
        yield
    finally:
        lock.release()


def held_by_a_process(path: Path) -> bool:
    """Whether any process holds a flock on `path` now (False when it does not exist)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        return False
    # "1: FLOCK  ADVISORY  WRITE 4711 08:01:1234567 0 EOF"; a waiter's line starts with "1: ->".
    return any(len(f) > 5 and f[1] == "FLOCK" and f[5] == wanted for f in (line.split() for line in table.splitlines()))
