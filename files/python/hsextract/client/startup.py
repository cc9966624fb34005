"""Where the client's start-up goes, phase by phase, from the process's own start.

A smoke test or a shard of a few thousand samples is dominated by the seconds before the first
request (the interpreter and its imports, transformers' import and the tokenizer, the dataset's
checks, waiting for the server, the capture probe). The client measures each phase and says them
in its log and its summary (``startup_s``), so the cost is measured on each host, not guessed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from hsextract.process_age import process_age_s
from hsextract.units import seconds


class StartupClock:
    """The seconds of each named phase of the start-up, in the order they ran."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        before = process_age_s()  # read first: the phases below start from here
        if before is not None:
            self.phases["process_and_imports"] = round(before, 2)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name`` (a phase that raises is recorded all the same)."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + time.monotonic() - t0, 2)

    def total_s(self) -> float:
        return round(sum(self.phases.values()), 2)

    def describe(self) -> str:
        """One line for the log: the total, then each phase."""
        parts = ", ".join(f"{name.replace('_', ' ')} {seconds(s)}" for name, s in self.phases.items())
        return f"{seconds(self.total_s())} before the first sample ({parts})"
