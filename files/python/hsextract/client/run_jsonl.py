"""The client's per-run JSONL files (rejects, failures): rewritten by each run, appended line by line."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, TextIO

from hsextract.errors import HsextractError


class RunJsonl:
    """A JSONL file rewritten from scratch by each run (its content is re-derived on restart).

    Emptied by `open`, once the run has begun: a refused or stopped start leaves the last run's
    file as it was (hsextract.client.start_state)."""

    def __init__(self, path: Path):
        self.path = path
        self._f: TextIO | None = None
        self._lock = threading.Lock()

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("w", encoding="utf-8")

    def write(self, obj: dict[str, Any]) -> None:
        with self._lock:
            if self._f is None:
                raise HsextractError(f"{self.path}: written before the run began")
            self._f.write(json.dumps(obj, ensure_ascii=False) + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
