"""Committing fetched samples to the collected set, and what a full volume does to a collect.

A sample is collected exactly when its line is in the collected manifest. The commit renames
verified temporary files to their final names in output-index order, fsyncs their directories,
then appends their lines (fsynced). A kill before the append leaves files past the manifest's
end: the next collect removes them at start (as the drain does, `remove_orphans`) and fetches
those samples again under the same numbers. Nothing is ever renamed over a committed sample.

A full volume (ENOSPC, EDQUOT) is not a sample's failure: with ``--wait-for-space`` the collect
says so with the numbers and retries; without it, it stops with the numbers. Either way every
sample committed so far stays, and the next collect goes on from there.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hsextract.collect.plan import collected_entry
from hsextract.collect.transfer import Fetched
from hsextract.durable import free_bytes, fsync_dir, is_no_space
from hsextract.errors import HsextractError
from hsextract.output.layout import collect_failures_path
from hsextract.output.manifest import ManifestAppender, ManifestEntry

log = logging.getLogger("hsextract.collect")
T = TypeVar("T")


class CollectorFull(HsextractError):
    """The collected set's volume is full and the collect was not asked to wait."""

    exit_code = 5  # as `hsextract plan` when the output volume cannot hold the run


@dataclass
class SpacePolicy:
    """Stop (wait_s 0) or wait and retry when the collected set's volume is full."""

    out: Path
    wait_s: float = 0.0

    def handle(self, exc: OSError, left: str) -> None:
        """Raise CollectorFull, or say so and sleep before the caller retries; `left` says what
        is still to do ("12 sample(s), 3456 bytes, still to fetch")."""
        what = (f"the collected set's volume is full: {self.out} has {free_bytes(self.out)} bytes free "
                f"({exc.strerror or exc}); {left}")
        if self.wait_s <= 0:
            raise CollectorFull(f"{what}. Free space or collect into a larger volume, then run collect again: "
                                "every sample collected so far stays, and it goes on from there")
        log.warning("%s; retrying every %g s", what, self.wait_s)
        time.sleep(self.wait_s)

    def retrying(self, fn: Callable[[], T], left: str) -> T:
        """fn(), retried (or stopped) on a full volume."""
        while True:
            try:
                return fn()
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                self.handle(exc, left)


class Committer:
    """Appends verified samples to the collected set, numbered from its current size on."""

    def __init__(self, out: Path, relative_path: Callable[[int], str], count: int):
        self.out = out
        self.relative_path = relative_path
        self.n = count
        self._appender = ManifestAppender(out)

    def commit(self, fetched: Sequence[Fetched]) -> tuple[list[ManifestEntry], OSError | None]:
        """Rename the verified files of `fetched` (in order) into place and record them.

        Returns the entries recorded, a prefix of `fetched`, and the full-volume error that cut
        it short (None when all were). When the manifest's lines find no room, the last files
        renamed are removed again, one by one, until they do: their space is what the lines of
        the others need, and they are fetched again later under the same numbers.
        """
        placed: list[ManifestEntry] = []
        dirs: set[Path] = set()
        full: OSError | None = None
        for f in fetched:
            assert f.tmp is not None
            rel = self.relative_path(self.n + len(placed))
            final = self.out / rel
            try:
                if not final.parent.is_dir():
                    final.parent.mkdir(parents=True)
                    dirs.add(final.parent.parent)
                os.replace(f.tmp, final)
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                full = exc
                break
            dirs.add(final.parent)
            placed.append(collected_entry(f.pending, self.n + len(placed), rel))
        for d in dirs:
            fsync_dir(d)
        while placed:
            try:
                self._appender.append(placed)
                break
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                full = exc
                (self.out / placed.pop().file).unlink()
        self.n += len(placed)
        return placed, full

    def close(self) -> None:
        self._appender.close()


class FailureJournal:
    """``.hsextract/collect-failures.jsonl``: the samples a collect could not verify, one line per
    (sample, reason, detail), so a collect that fails the same way again adds nothing."""

    def __init__(self, out: Path):
        self.path = collect_failures_path(out)
        _cut_torn_tail(self.path)  # a kill mid-append: the next append must start on a line of its own
        self.lines = read_failures(self.path)
        self._seen = {_key(d) for d in self.lines}

    def record(self, failed: Sequence[Fetched], space: SpacePolicy) -> int:
        """Append the failures not recorded yet (fsynced); return how many were new."""
        new = []
        for f in failed:
            e = f.pending.entry
            line = {"index": e.dataset_index, "rid": e.rid, "reason": f.reason, "detail": f.detail,
                    "host": f.pending.host, "host_index": e.output_index}
            if _key(line) not in self._seen:
                self._seen.add(_key(line))
                new.append(line)
        if new:
            text = "".join(json.dumps(d, sort_keys=True) + "\n" for d in new)
            space.retrying(lambda: _append_fsynced(self.path, text), "the failures of this collect are still to record")
            self.lines.extend(new)
        return len(new)


def read_failures(path: Path) -> list[dict]:
    """The complete lines of a failures journal (a torn last line is skipped)."""
    out: list[dict] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return out
    for line in text.splitlines(keepends=True):
        if line.endswith("\n"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _append_fsynced(path: Path, text: str) -> None:
    """Append `text` and fsync; on failure (a full volume) cut the file back to where it was."""
    with open(path, "a", encoding="utf-8") as fh:
        size = fh.tell()
        try:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        except OSError:
            fh.truncate(size)
            raise


def _cut_torn_tail(path: Path) -> None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        os.truncate(path, keep)


def _key(d: dict) -> tuple:
    return d.get("host"), d.get("host_index"), d.get("reason"), d.get("detail")
