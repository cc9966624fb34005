"""Move a dump that cannot become a sample out of staging, with its reason; never into the set.

The copy is made under a temporary name, renamed into place, and only then is the staged dump
removed. A crash between the rename and the removal leaves the same dump in both places: the
copy records which staged dump it came from (`QUARANTINE_SOURCE`), so the restart only finishes the
removal instead of quarantining it a second time. A later dump of the same rid (the client sent
the sample again) is another dump and gets its own directory, ``<rid>.<n>``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from hsextract.durable import is_no_space
from hsextract.output.layout import QUARANTINE_REASON, QUARANTINE_RECORD, QUARANTINE_SOURCE
from hsextract.staging.dumps import discard_dump
from hsextract.staging.records import record_path, remove_record

log = logging.getLogger("hsextract.drain")


class Quarantine:
    """Quarantines dumps of one staging directory into one quarantine directory."""

    def __init__(self, root: Path, dump_dir: Path, pause_for_space: Callable[[Path, OSError], None]):
        self.root = Path(root)
        self.dump_dir = Path(dump_dir)
        self._pause_for_space = pause_for_space  # a full volume waits for space, it does not fail

    def move(self, d: Path, rid: str, reason: str, detail: str) -> bool:
        """Quarantine the dump ``d``; False when it had been quarantined before a restart (only
        its staged copy is removed then, and it is not counted again)."""
        source = dump_identity(d)
        target = self.root / rid
        n = 1
        while target.exists():
            if _read_source(target) == source:
                log.warning("dump %s was quarantined to %s before a restart; removing the staged copy", rid, target)
                discard_dump(d)
                remove_record(self.dump_dir, rid)
                return False
            target = self.root / f"{rid}.{n}"
            n += 1
        while True:
            try:
                self._copy(d, rid, target, reason, detail, source)
                break
            except OSError as exc:
                if not is_no_space(exc):
                    raise
                self._pause_for_space(self.root, exc)
        discard_dump(d)
        remove_record(self.dump_dir, rid)
        log.error("dump %s quarantined to %s: %s: %s", rid, target, reason, detail)
        return True

    def _copy(self, d: Path, rid: str, target: Path, reason: str, detail: str, source: dict[str, object]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{target.name}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        shutil.copytree(d, tmp, symlinks=True)  # a link in staging is copied as a link, never followed
        rec = record_path(self.dump_dir, rid)
        if rec.exists():
            shutil.copy2(rec, tmp / QUARANTINE_RECORD)
        (tmp / QUARANTINE_REASON).write_text(f"{reason}\n{detail}\n")
        (tmp / QUARANTINE_SOURCE).write_text(json.dumps(source) + "\n")
        os.replace(tmp, target)


def dump_identity(d: Path) -> dict[str, object]:
    """What tells this staged dump from any other with the same name: inode and times of its files."""
    ident: dict[str, object] = {"dump": str(d)}
    for p in [d, *sorted(safe_iterdir(d))]:
        with contextlib.suppress(FileNotFoundError):
            st = p.stat()
            ident[p.name if p != d else "."] = [st.st_ino, st.st_size, st.st_mtime_ns]
    return ident


def _read_source(quarantined: Path) -> dict[str, object] | None:
    try:
        return json.loads((quarantined / QUARANTINE_SOURCE).read_text())
    except (OSError, ValueError):
        return None


def safe_iterdir(path: Path) -> Iterator[Path]:
    try:
        yield from path.iterdir()
    except FileNotFoundError:
        return
