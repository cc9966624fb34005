"""``.hsextract/collect-failures.jsonl``: the samples a collect could not verify, and why.

One line per (sample, reason, detail), appended and fsynced; a collect that fails the same way
again adds nothing. A line torn by a kill is cut off when the journal is opened (the repair of
hsextract.output.repair), so the next append starts on a line of its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from hsextract.collect.space import SpacePolicy
from hsextract.collect.transfer import Fetched
from hsextract.output.layout import collect_failures_path
from hsextract.output.repair import cut_torn_tail


class FailureJournal:
    """``.hsextract/collect-failures.jsonl``: the samples a collect could not verify, one line per
    (sample, reason, detail), so a collect that fails the same way again adds nothing."""

    def __init__(self, out: Path):
        self.path = collect_failures_path(out)
        cut_torn_tail(self.path)  # a kill mid-append: the next append must start on a line of its own
        self.lines = read_failures(self.path)
        self._seen = {_key(d) for d in self.lines}

    def record(self, failed: Sequence[Fetched], space: SpacePolicy) -> int:
        """Append the failures not recorded yet (fsynced); return how many were new."""
        new = []
        for f in failed:
            e = f.pending.entry
            line = {
                "index": e.dataset_index,
                "rid": e.rid,
                "reason": f.reason,
                "detail": f.detail,
                "host": f.pending.host,
                "host_index": e.output_index,
            }
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


def _key(d: dict) -> tuple:
    return d.get("host"), d.get("host_index"), d.get("reason"), d.get("detail")
