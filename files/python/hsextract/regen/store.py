"""The regenerated dataset on disk: append-only, one line per conversation, and what it says is done.

``<output>/conversations.jsonl`` gets one line per regenerated conversation and
``<output>/.hsextract/regen-errors.jsonl`` one per conversation that could not be; every line
carries the conversation's ``key`` (its own id, else a hash of its content). Each line is
written whole, flushed and fsynced before the conversation counts as done, so the files are the
state: a restart rebuilds the done set from them and skips those keys, whatever the order in
which conversations finished, however the process died. A line torn by a kill in the middle of
a write is cut off at start (its conversation is done again). Nothing is ever rewritten.

The run's settings (model, sampling, reasoning mode, turns) are recorded at the first start; a
restart with other settings is refused, so one dataset never mixes two samplings unnoticed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from hsextract.dataset.conversation import Conversation
from hsextract.durable import atomic_write_json
from hsextract.errors import ConfigError, HsextractError
from hsextract.output.layout import regen_errors_path, regen_output_path, regen_settings_path, state_dir
from hsextract.regen.totals import Totals

log = logging.getLogger("hsextract.regen")


def conversation_key(conv: Conversation) -> str:
    """The resume key of a conversation: its own id, else a digest of everything the model is given."""
    if conv.id is not None:
        return f"id:{conv.id}"
    body = conv.to_openai()
    payload = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha:" + hashlib.blake2b(payload.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def repair_torn_tail(path: Path) -> int:
    """Cut a last line that has no newline (a write killed midway); return the bytes removed."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with path.open("rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # find the last newline, reading backwards in blocks
        pos, keep = size, 0
        while pos > 0:
            step = min(1 << 16, pos)
            pos -= step
            f.seek(pos)
            block = f.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = pos + nl + 1
                break
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return size - keep


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every record of a JSONL state file; HsextractError for a line that is not one."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return
    with f:
        for n, raw in enumerate(f, 1):
            try:
                record = json.loads(raw)
                record["key"] = str(record["key"])
            except (ValueError, KeyError, TypeError):
                raise HsextractError(
                    f"{path}: line {n} is not a record of this tool ({raw[:80]!r}); the file was "
                    "changed by something else: remove that line (its conversation is then done "
                    "again)"
                ) from None
            yield record


class Store:
    """The output and errors files of one run, and the keys they already hold."""

    def __init__(self, output: Path):
        self.output = Path(output)
        self.state = state_dir(self.output)
        self.data_path = regen_output_path(self.output)
        self.errors_path = regen_errors_path(self.output)
        self._lock = threading.Lock()
        self._data: BinaryIO | None = None
        self._errors: BinaryIO | None = None
        self.done: set[str] = set()
        self.ok_keys: set[str] = set()
        self.totals = Totals()  # what both files hold, over every run that wrote them

    def open(self) -> None:
        """Repair torn last lines, rebuild the done set, open both files for appending."""
        self.state.mkdir(parents=True, exist_ok=True)
        for path in (self.data_path, self.errors_path):
            cut = repair_torn_tail(path)
            if cut:
                log.warning(
                    "%s: removed a torn last line (%d bytes) left by a run that was killed while writing it; "
                    "its conversation is done again",
                    path,
                    cut,
                )
        self.totals = Totals()
        for record in read_records(self.data_path):
            self.ok_keys.add(record["key"])
            self.totals.add_ok(record)
        for record in read_records(self.errors_path):
            self.done.add(record["key"])
            self.totals.add_error(record)
        self.done |= self.ok_keys
        self._data = self.data_path.open("ab")
        self._errors = self.errors_path.open("ab")

    def check_settings(self, settings: dict[str, Any]) -> None:
        """Record the run's settings, or refuse to resume under different ones."""
        path = regen_settings_path(self.output)
        try:
            before = json.loads(path.read_text())
        except FileNotFoundError:
            atomic_write_json(path, settings)
            return
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: unreadable ({exc}); remove it to start over with this run's settings") from exc
        differ = {k: (before.get(k), v) for k, v in settings.items() if before.get(k) != v}
        if differ:
            what = "; ".join(f"{k}: {a!r} then, {b!r} now" for k, (a, b) in sorted(differ.items()))
            raise ConfigError(
                f"{self.output} was regenerated with other settings ({what}); use another --output, "
                f"or remove {path} to mix them on purpose"
            )

    def _append(self, f, record: dict[str, Any], count) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
        with self._lock:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
            self.done.add(record["key"])
            count(record)

    def write_ok(self, record: dict[str, Any]) -> None:
        self._append(self._data, record, self.totals.add_ok)
        self.ok_keys.add(record["key"])

    def write_error(self, record: dict[str, Any]) -> None:
        self._append(self._errors, record, self.totals.add_error)

    def close(self) -> None:
        for f in (self._data, self._errors):
            if f is not None:
                f.close()
