"""Fetching one host sample into the collected set: copy, hard link or move, then verify.

The file is placed under a temporary name in the collected set (``.hsextract/collect-tmp/``),
made durable, and re-hashed there against the host manifest's size and checksum: what is
checked is the very file the trainer will read. A file that fails is fetched again once (a
read that went wrong, a file rsync was still replacing); a second failure is the sample's
failure, with its reason. Only a verified file is ever renamed into the set (`hsextract.output.commit`).

* copy (the default): the bytes are copied and fsynced; the host output is left as it was.
* link: a hard link to the host's file (the same bytes, no space used; host output and
  collected set must share a filesystem). Nothing may then rewrite the host's file in place:
  rsync replaces files by renaming a new copy over them (unless told ``--inplace``), which
  leaves the collected link alone.
* move: a hard link where the filesystems agree, else a copy; the host's file is removed
  once the sample is committed to the collected set (`Fetcher.release`), never before.

Whatever the mode, a host's row is not trusted: its file is opened, linked or removed only as its
sample's own name and a regular file inside the host output, reached without following a link
(hsextract.contained); anything else is the row's failure (`collect_unsafe_path`) and is never
read, so no size or checksum of it is ever printed. A placed file must also hold the row's sample
(hsextract.formats.sample_check: its token count, its fingerprint), else `collect_wrong_sample`.
Neither is fetched a second time: another read gives the same.

With ``--to-bf16`` a host file of FP8 rows, once verified as above, is converted to a bf16 file
(hsextract.formats.to_bf16: dequantized as the trainer's reader does), which is verified in turn
against its own new row before it takes the host file's place; the collected row is the new file's.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hsextract.collect.selection import Pending
from hsextract.contained import UnsafePath, link_regular, open_regular, unlink_regular
from hsextract.durable import fsync_dir, is_no_space, write_file_durably
from hsextract.formats.sample_check import SampleCheck
from hsextract.output.collect_reasons import REASONS, UNREADABLE, UNSAFE, WRONG_SAMPLE
from hsextract.output.manifest import ManifestEntry, file_problem

if TYPE_CHECKING:
    from hsextract.formats.to_bf16 import Bf16Conversion

log = logging.getLogger("hsextract.collect")

MODES = ("copy", "link", "move")
_CHUNK = 8 << 20


@dataclass
class Fetched:
    """The outcome of fetching one sample: a verified temporary file, or why there is none."""

    pending: Pending
    tmp: Path | None = None
    reason: str = ""
    detail: str = ""
    no_space: OSError | None = None  # the collected set's volume is full: retry later, not a failure
    attempts: int = 0
    converted: ManifestEntry | None = None  # the row of the bf16 file made of FP8 rows (--to-bf16)


class Fetcher:
    """Places host samples in the collected set's temporary directory by one transfer mode.

    A host's rows are not trusted (hsextract.contained): a row's file is read, linked or removed
    only when it is its sample's own name (`SampleCheck.name_problem`) and a regular file reached
    inside the host output without following a link; the placed copy must then be the row's
    sample (`SampleCheck.content_problem`), not only of its size and checksum.
    """

    def __init__(
        self,
        mode: str,
        tmp_dir: Path,
        hosts: dict[str, Path],
        same_fs: dict[str, bool],
        checks: dict[str, SampleCheck],
        conversion: Bf16Conversion | None = None,
    ):
        self.mode = mode
        self.tmp_dir = tmp_dir
        self.hosts = hosts
        self.same_fs = same_fs
        self.checks = checks  # each host's rows checked against its own header (its precision)
        self.conversion = conversion  # --to-bf16: FP8 rows become bf16 files (hsextract.formats.to_bf16)

    def source(self, p: Pending) -> str:
        """The host's file of `p`, as a refusal or failure names it (never opened by this name)."""
        return f"{self.hosts[p.host]}/{p.entry.file}"

    def refusal(self, p: Pending) -> tuple[str, str] | None:
        """(reason, detail) when the row of `p` is not to be read at all: its file is no plain path
        inside the host output, or not its sample's name."""
        try:
            wrong = self.checks[p.host].name_problem(p.entry)
        except UnsafePath as exc:
            return UNSAFE, f"host output {self.hosts[p.host]}: {exc}; not read"
        return (WRONG_SAMPLE, f"host output {self.hosts[p.host]}: {wrong}; not read") if wrong else None

    def fetch(self, k: int, p: Pending) -> Fetched:
        """Fetch `p` as the k-th sample of this collect, verify it, and once more if that fails."""
        out = Fetched(p)
        refused = self.refusal(p)
        if refused is not None:
            out.reason, out.detail = refused
            return out
        tmp = self.tmp_dir / f"{k}.tmp"
        src = self.source(p)
        for out.attempts in (1, 2):
            try:
                self.place(p, tmp)
                problem = self._placed_problem(p, tmp, src, out)
            except UnsafePath as exc:
                problem = ("unsafe", f"host output {self.hosts[p.host]}: {exc}")
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
            out.reason, out.detail = _REASONS.get(problem[0], UNREADABLE), problem[1]
            if problem[0] in ("unsafe", "wrong_sample"):
                break  # what the host holds, not a read gone wrong: another read gives the same
        return out

    def _placed_problem(self, p: Pending, tmp: Path, src: str, out: Fetched) -> tuple[str, str] | None:
        """Why the placed file `tmp` is not the row's sample (its size, checksum, contents), or None;
        with --to-bf16, a verified FP8 file is then converted in place (`out.converted`)."""
        problem = file_problem(tmp, p.entry)
        if problem is not None:  # say it of the host's file, the temporary name means nothing later
            return problem[0], f"{src} as fetched: {problem[1].removeprefix(f'{tmp}: ')}"
        wrong = self.checks[p.host].content_problem(tmp, p.entry)
        if wrong is None and self._converts(p):
            out.converted, wrong = self._convert(p, tmp)
        return ("wrong_sample", f"{src}: {wrong}") if wrong else None

    def _converts(self, p: Pending) -> bool:
        return self.conversion is not None and self.checks[p.host].header.precision == "fp8"

    def _convert(self, p: Pending, tmp: Path) -> tuple[ManifestEntry | None, str]:
        """The verified FP8 file `tmp` made a verified bf16 file in its place: (its row, "") or (None, why)."""
        assert self.conversion is not None
        bf16 = tmp.with_name(f"{tmp.name}.bf16")
        converted, wrong = self.conversion.verified(tmp, bf16, p.entry, self.checks[p.host].header)
        if converted is not None:
            os.replace(bf16, tmp)
        return converted, wrong

    def place(self, p: Pending, tmp: Path) -> None:
        """Make `tmp` a durable copy of, or link to, the host's file of `p` (a regular file inside
        the host output, reached without following a link: UnsafePath otherwise)."""
        root = self.hosts[p.host]
        _remove(tmp)
        if self.mode == "copy" or not self.same_fs[p.host]:
            fd = open_regular(root, p.entry.file)
            try:
                write_file_durably(tmp, _chunks(fd))
            finally:
                os.close(fd)
            return
        link_regular(root, p.entry.file, tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # rsync does not fsync what it writes; the collected set must be durable
        finally:
            os.close(fd)

    def release(self, committed: list[Pending]) -> None:
        """After a commit: remove the hosts' files of the committed samples (``--move`` only). Only
        a row's own file, a regular file inside its host output, is ever removed."""
        if self.mode != "move":
            return
        dirs = set()
        for p in committed:
            refused = self.refusal(p)
            if refused is not None:
                log.warning("--move: host %s sample %d left in place: %s", p.host, p.entry.output_index, refused[1])
                continue
            root = self.hosts[p.host]
            try:
                if unlink_regular(root, p.entry.file):
                    dirs.add((root / p.entry.file).parent)
            except UnsafePath as exc:
                log.warning("--move: host %s sample %d left in place: %s", p.host, p.entry.output_index, exc)
        for d in dirs:
            fsync_dir(d)


_REASONS = {**REASONS, "unsafe": UNSAFE, "wrong_sample": WRONG_SAMPLE}


def same_filesystem(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev


def _chunks(fd: int) -> Iterator[bytes]:
    while chunk := os.read(fd, _CHUNK):
        yield chunk


def _remove(p: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        p.unlink()
