"""The ordered commit: durable temporary files become samples of an output directory, in order.

One implementation for the drain (hsextract.output.committer, its commit thread) and for collect
(hsextract.collect.runner). For a batch of samples, each a durable temporary file on the output's
filesystem, in this order (the crash-safety argument is at the top of hsextract.drain.core):

1. each file takes the next output index and is renamed to its final name (its directory made
   first, when it is new);
2. the directories are fsynced: the new ones' parents, the renamed files', and the temporary
   files' own when the caller names it;
3. the batch's manifest rows are appended and the manifest is fsynced.

So the manifest is always the contiguous prefix 0..n-1 of the output indices (the speculators
Arrow row of sample i is ``hs_i``), a sample counts as written exactly when its row is there,
and a kill before step 3 leaves files at indices at or past the manifest's end: orphans, removed
at the next start (hsextract.output.repair), their samples written again under the same numbers.
Nothing is ever renamed over a recorded sample.

What a full volume (ENOSPC, EDQUOT) does, at step 1 or 3, is the caller's (`OnFull`):

* the drain waits for space and the step is tried again: what it holds is half-way between
  staging and the set, and nothing else can make room;
* collect stops short (`stop_short`): the files renamed last are removed again, one by one, until
  the rows of the others fit (their space is what those rows need); the commit returns the
  prefix it recorded and the error, and collect gives the rest's room back, then stops or waits
  and fetches them again under the same numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hsextract.durable import fsync_dir, is_no_space
from hsextract.output.manifest import ManifestAppender, ManifestEntry

OnFull = Callable[[OSError], bool]
"""What a full volume does to a commit: wait for space and return True (the step is tried
again), or return False (the commit stops short, see the module's docstring). It may raise."""


def stop_short(exc: OSError) -> bool:
    """The full-volume policy of a caller that waits, if at all, outside the commit (collect)."""
    return False


@dataclass(frozen=True)
class ToCommit:
    """A sample ready for its place: a durable temporary file, and its manifest row once placed."""

    tmp: Path
    row: Callable[[int, str], ManifestEntry]  # (output index, file relative to the output) -> the row


class OrderedCommit:
    """Commits samples to the output directory `out`, numbered from `count` (the manifest's length) on.

    Owns the manifest's appender while it is open; one thread at a time.
    """

    def __init__(
        self,
        out: Path,
        relative_path: Callable[[int], str],
        count: int,
        on_full: OnFull,
        *,
        tmp_dir: Path | None = None,
    ):
        self.out = Path(out)
        self.count = count
        self._relative_path = relative_path
        self._on_full = on_full
        self._tmp_dir = tmp_dir  # fsynced with the others: the renamed files' names leave it
        self._appender = ManifestAppender(self.out)

    def commit(self, samples: Sequence[ToCommit]) -> tuple[list[ManifestEntry], OSError | None]:
        """Rename the files of `samples` (in order) into place and record them (the steps above).

        Returns the rows recorded, those of a prefix of `samples`, and the full-volume error that
        cut it short (None when all were recorded).
        """
        if not samples:
            return [], None
        placed, dirs, full = self._place(samples)
        for d in dirs:
            fsync_dir(d)
        if placed and self._tmp_dir is not None:
            fsync_dir(self._tmp_dir)
        while placed:
            no_room = self._append(placed)
            if no_room is None:
                break
            full = no_room
            (self.out / placed.pop().file).unlink()
        self.count += len(placed)
        return placed, full

    def record(self, rows: Sequence[ManifestEntry]) -> None:
        """Append rows whose samples are in place by other means (a bucket's objects), numbered on
        from `count`; a full volume the policy does not wait out raises."""
        no_room = self._append(rows)
        if no_room is not None:
            raise no_room
        self.count += len(rows)

    def close(self) -> None:
        self._appender.close()

    def _place(self, samples: Sequence[ToCommit]) -> tuple[list[ManifestEntry], set[Path], OSError | None]:
        """Step 1: the rows of the samples renamed into place, the directories to fsync, and the
        full-volume error that stopped the renames short (None when all were renamed)."""
        placed: list[ManifestEntry] = []
        dirs: set[Path] = set()
        for s in samples:
            idx = self.count + len(placed)
            rel = self._relative_path(idx)
            final = self.out / rel
            while True:
                try:
                    if not final.parent.is_dir():
                        final.parent.mkdir(parents=True)
                        dirs.add(final.parent.parent)
                    os.replace(s.tmp, final)
                    break
                except OSError as exc:
                    if not is_no_space(exc):
                        raise
                    if not self._on_full(exc):
                        return placed, dirs, exc
            dirs.add(final.parent)
            placed.append(s.row(idx, rel))
        return placed, dirs, None

    def _append(self, rows: Sequence[ManifestEntry]) -> OSError | None:
        """Step 3: append the rows durably (a failed append leaves no partial line); the
        full-volume error the policy did not wait out, else None."""
        while True:
            try:
                self._appender.append(rows)
                return None
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                if not self._on_full(exc):
                    return exc
