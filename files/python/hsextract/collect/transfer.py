"""Fetching one host sample into the collected set: copy, hard link or move, then verify.

The file is placed under a temporary name in the collected set (``.hsextract/collect-tmp/``),
made durable, and re-hashed there against the host manifest's size and checksum: what is
checked is the very file the trainer will read. A file that fails is fetched again once (a
read that went wrong, a file rsync was still replacing); a second failure is the sample's
failure, with its reason. Only a verified file is ever renamed into the set (`hsextract.collect.commit`).

* copy (the default): the bytes are copied and fsynced; the host output is left as it was.
* link: a hard link to the host's file (the same bytes, no space used; host output and
  collected set must share a filesystem). Nothing may then rewrite the host's file in place:
  rsync replaces files by renaming a new copy over them (unless told ``--inplace``), which
  leaves the collected link alone.
* move: a hard link where the filesystems agree, else a copy; the host's file is removed
  once the sample is committed to the collected set (`Fetcher.release`), never before.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hsextract.collect.plan import Pending
from hsextract.durable import fsync_dir, is_no_space, write_file_durably
from hsextract.formats.manifest import file_problem

MODES = ("copy", "link", "move")
_CHUNK = 8 << 20
# What a file's problem (hsextract.formats.manifest.file_problem) is called in the failures.
REASONS = {"missing": "collect_missing", "size": "collect_size", "checksum": "collect_checksum"}
UNREADABLE = "collect_unreadable"


@dataclass
class Fetched:
    """The outcome of fetching one sample: a verified temporary file, or why there is none."""

    pending: Pending
    tmp: Path | None = None
    reason: str = ""
    detail: str = ""
    no_space: OSError | None = None  # the collected set's volume is full: retry later, not a failure
    attempts: int = 0


class Fetcher:
    """Places host samples in the collected set's temporary directory by one transfer mode."""

    def __init__(self, mode: str, tmp_dir: Path, hosts: dict[str, Path], same_fs: dict[str, bool]):
        self.mode = mode
        self.tmp_dir = tmp_dir
        self.hosts = hosts
        self.same_fs = same_fs

    def source(self, p: Pending) -> Path:
        return self.hosts[p.host] / p.entry.file

    def fetch(self, k: int, p: Pending) -> Fetched:
        """Fetch `p` as the k-th sample of this collect, verify it, and once more if that fails."""
        out = Fetched(p)
        tmp = self.tmp_dir / f"{k}.tmp"
        src = self.source(p)
        for out.attempts in (1, 2):
            try:
                self.place(p, tmp)
                problem = file_problem(tmp, p.entry)
                if problem is not None:  # say it of the host's file, the temporary name means nothing later
                    problem = (problem[0], f"{src} as fetched: {problem[1].removeprefix(f'{tmp}: ')}")
            except FileNotFoundError:
                problem = ("missing", f"{src}: missing")
            except OSError as exc:
                if is_no_space(exc):
                    _remove(tmp)
                    out.no_space = exc
                    return out
                problem = ("unreadable", f"{src}: {exc.strerror or exc}")
            if problem is None:
                out.tmp = tmp
                return out
            _remove(tmp)
            out.reason, out.detail = REASONS.get(problem[0], UNREADABLE), problem[1]
        return out

    def place(self, p: Pending, tmp: Path) -> None:
        """Make `tmp` a durable copy of, or link to, the host's file of `p`."""
        src = self.source(p)
        _remove(tmp)
        if self.mode == "copy" or not self.same_fs[p.host]:
            write_file_durably(tmp, _chunks(src))
            return
        os.link(src, tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # rsync does not fsync what it writes; the collected set must be durable
        finally:
            os.close(fd)

    def release(self, committed: list[Pending]) -> None:
        """After a commit: remove the hosts' files of the committed samples (``--move`` only)."""
        if self.mode != "move":
            return
        dirs = set()
        for p in committed:
            src = self.source(p)
            with contextlib.suppress(FileNotFoundError):
                src.unlink()
                dirs.add(src.parent)
        for d in dirs:
            fsync_dir(d)


def same_filesystem(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev


def _chunks(src: Path) -> Iterator[bytes]:
    with open(src, "rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def _remove(p: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        p.unlink()
