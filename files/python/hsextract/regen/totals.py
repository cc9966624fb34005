"""What a regeneration's output and errors files hold, counted: the whole regeneration's outcome.

A regeneration is resumed run after run (a kill, a reboot, a server gone), and each run writes
only the conversations the earlier ones left. Counted from the lines of both files, as they are
read back at start and as each line is written, the totals describe the whole regeneration and
agree with the files line for line, whichever run wrote each line.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Totals:
    ok: int = 0  # lines of the regenerated dataset
    turns: int = 0  # replies regenerated in them
    truncated: int = 0  # of those, cut by the token limit
    completion_tokens: int = 0
    cut: Counter = field(default_factory=Counter)  # conversations cut before their end, by reason
    failed: Counter = field(default_factory=Counter)  # lines of the errors file, by reason

    def add_ok(self, record: dict[str, Any]) -> None:
        done = record.get("regenerated")
        if not isinstance(done, dict):
            done = {}
        self.ok += 1
        self.turns += int(done.get("turns") or 0)
        self.truncated += int(done.get("truncated") or 0)
        self.completion_tokens += int(done.get("completion_tokens") or 0)
        cut = done.get("cut")
        if isinstance(cut, dict) and cut.get("reason"):
            self.cut[str(cut["reason"])] += 1

    def add_error(self, record: dict[str, Any]) -> None:
        self.failed[str(record.get("reason") or "unknown")] += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "failed": dict(self.failed),
            "cut": dict(self.cut),
            "truncated": self.truncated,
            "turns": self.turns,
            "completion_tokens": self.completion_tokens,
        }
