"""One owner per output directory: locks that say who holds them, and that die with their holder.

Two processes writing one output directory corrupt it without a word: two drains take the same
output index for different samples (a manifest row twice, a sample file overwritten), and two
clients of the same samples send the same request ids (the server refuses the second, and the
drain then throws away the first one's dumps as having no record). So ownership is explicit:

* the training set's writer holds ``.hsextract/output.lock`` for its whole life: the drain, and
  ``hsextract finalize`` (with ``--verify`` too: it reads what a drain would be rewriting). A
  second one refuses at start, naming the holder. `OutputLock` is the one way to take it;
* each client holds the lock of its shard, ``.hsextract/client-<i>-of-<n>.lock``. Clients of
  disjoint shards of one output cooperate (several clients on sub-shards of one output, all of
  one run id); a client whose shard shares a sample with a running client's shard refuses.
  `ShardLock` takes it; `running_clients` lists the holders (the drain's ``--exit-when-done``
  does not take a run for finished while a client of it runs).

Shards: a sample of dataset index x belongs to shard i/n when x % n == i. Shards i/n and j/m
share a sample iff some x has x ≡ i (mod n) and x ≡ j (mod m), which by the Chinese remainder
theorem is iff i ≡ j (mod gcd(n, m)): 0/1 overlaps every shard, 1/2 overlaps 1/4 and 3/4 but not
2/4, 0/2 and 1/3 overlap (at 3). Whether the dataset is long enough to reach the shared index
does not matter: the shards are what the operator asked for, and one of them is a mistake.

Why flock(2) and not a pid file: the kernel releases the lock when its holder dies, kill -9
included, so the next start takes over at once, and a pid reused by an unrelated process can
never keep an output locked. The holder writes who it is (role, pid, host, shard, since) into
the lock file once it holds it, so a refusal names it; the file outlives the holder, the lock
does not. A client's check of the other shards and the taking of its own are one step under
``.hsextract/clients.lock``, held for milliseconds, so two clients starting at once cannot both
miss each other. flock is per open file: the descriptors are close-on-exec, so a program the
holder starts does not inherit its lock (a child forked without exec would; none is).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hsextract.errors import ConfigError, HsextractError
from hsextract.output.layout import (
    CLIENT_LOCK_RE,
    client_lock_path,
    clients_registry_path,
    output_lock_path,
    shard_in_name,
    state_dir,
)
from hsextract.shard import Shard

# How long a refused start waits for the holder to finish writing who it is (it writes right
# after taking the lock; this is only the window between the two).
_HOLDER_WAIT_S = 1.0


class OutputBusy(HsextractError):
    """Another process owns what this one would write: refused at start, naming the holder."""

    exit_code = 75  # sysexits.h EX_TEMPFAIL: try again once the holder has stopped


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as the holder wrote it into the lock file."""

    role: str  # "drain", "finalize", "client", ...
    pid: int
    host: str
    started_at: float
    shard: Shard | None = None

    def describe(self) -> str:
        """E.g. ``hsextract drain (pid 4711 on gpu-3, since 2026-12-01 10:04:05)``."""
        shard = f" of shard {self.shard}" if self.shard else ""
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_at)) if self.started_at else "?"
        return f"hsextract {self.role}{shard} (pid {self.pid} on {self.host}, since {since})"

    def to_json(self) -> dict[str, Any]:
        """What the holder writes into the lock file (the shard as ``[i, n]``, as always)."""
        data = asdict(self)
        data["shard"] = self.shard.to_json() if self.shard else None
        return data


def _this_process(role: str, shard: Shard | None = None) -> Holder:
    return Holder(role=role, pid=os.getpid(), host=socket.gethostname(), started_at=time.time(), shard=shard)


class _LockFile:
    """One lock file: take its flock without waiting, say who holds it, let it go."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def try_take(self, read_only: bool = False) -> bool:
        """True when this process now holds the lock; False when another does. ``read_only``: a
        directory this process cannot write (a verification of a read-only set) is locked through
        a read-only descriptor, and without a lock file nobody can hold it (taking it needs one)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if not read_only or exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def write_holder(self, holder: Holder) -> None:
        """Say who holds it (in the same file: the lock is on this inode, a rename would lose it)."""
        if self.fd is None:
            return
        data = json.dumps(holder.to_json(), sort_keys=True).encode()
        with contextlib.suppress(OSError):  # a read-only descriptor: the lock holds all the same
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def read_holder(path: Path, wait_s: float = _HOLDER_WAIT_S) -> Holder | None:
    """Who the lock file says holds it; None if it does not say (yet) within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            data = json.loads(path.read_text())
            shard = data.get("shard")
            return Holder(
                role=str(data["role"]),
                pid=int(data["pid"]),
                host=str(data["host"]),
                started_at=float(data.get("started_at") or 0),
                shard=Shard.from_json(shard) if shard else None,
            )
        except (OSError, ValueError, KeyError, TypeError, IndexError, ConfigError):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)


def _who(holder: Holder | None) -> str:
    return holder.describe() if holder else "a process that has not said who it is"


class OutputLock:
    """The exclusive lock of an output directory's training-set writer: the drain, ``hsextract
    finalize``, and any later command that writes the set (``collect``). Hold it with ``with``."""

    def __init__(self, output: str | Path, role: str, *, read_only: bool = False):
        self.output = Path(output)
        self.role = role
        self.read_only = read_only
        self._file = _LockFile(output_lock_path(self.output))

    def acquire(self) -> OutputLock:
        """Take the lock, or raise OutputBusy naming its holder."""
        if not self.read_only:
            state_dir(self.output).mkdir(parents=True, exist_ok=True)
        elif not state_dir(self.output).is_dir():
            return self  # nothing was ever drained here: nobody can hold it
        if not self._file.try_take(read_only=self.read_only):
            holder = read_holder(self._file.path)
            raise OutputBusy(
                f"the output directory {self.output} is in use by {_who(holder)}: one process writes a training "
                f"set at a time (two would write samples over each other). Stop that one first, or give this "
                f"{self.role} another --output"
            )
        self._file.write_holder(_this_process(self.role))
        return self

    def release(self) -> None:
        self._file.release()

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def _clients_registry(output: Path) -> Iterator[None]:
    """The short lock under which clients look at each other's shards and take their own."""
    state_dir(output).mkdir(parents=True, exist_ok=True)
    fd = os.open(clients_registry_path(output), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def _client_lock_files(output: Path) -> list[tuple[Path, Shard]]:
    out = []
    with contextlib.suppress(FileNotFoundError):
        for p in sorted(state_dir(output).iterdir()):
            shard = shard_in_name(re.fullmatch(CLIENT_LOCK_RE, p.name))
            if shard is not None:
                out.append((p, shard))
    return out


def _held_by(path: Path, shard: Shard) -> Holder | None:
    """The holder of a client's lock file, or None when nobody holds it (its client has gone)."""
    probe = _LockFile(path)
    try:
        taken = probe.try_take()
    except FileNotFoundError:
        return None
    if taken:
        probe.release()
        return None
    return read_holder(path) or Holder("client", 0, "?", 0.0, shard)


class ShardLock:
    """A client's lock on its shard of an output directory; clients of disjoint shards cooperate."""

    def __init__(self, output: str | Path, shard: Shard):
        self.output = Path(output)
        self.shard = shard
        self._file = _LockFile(client_lock_path(self.output, shard))

    def acquire(self) -> ShardLock:
        """Take the shard's lock, or raise OutputBusy naming a running client of an overlapping shard."""
        with _clients_registry(self.output):
            for path, shard in _client_lock_files(self.output):
                if path != self._file.path and shard.overlaps(self.shard):
                    holder = _held_by(path, shard)
                    if holder is not None:
                        raise self._busy(holder, "whose shard shares samples with this client's shard")
            if not self._file.try_take():
                raise self._busy(read_holder(self._file.path), "which runs this client's shard")
            self._file.write_holder(_this_process("extract", self.shard))
        return self

    def _busy(self, holder: Holder | None, why: str) -> OutputBusy:
        return OutputBusy(
            f"the output directory {self.output} is in use by {_who(holder)}, {why} {self.shard}: two clients of one "
            "sample would send the same request id. Stop that client "
            "first, or give this one a shard disjoint from it (--shard)"
        )

    def release(self) -> None:
        self._file.release()

    def __enter__(self) -> ShardLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def running_clients(output: str | Path) -> list[Holder]:
    """The clients that hold a shard of `output` now."""
    out = Path(output)
    if not state_dir(out).is_dir():
        return []
    with _clients_registry(out):
        holders = [_held_by(path, shard) for path, shard in _client_lock_files(out)]
    return [h for h in holders if h is not None]
