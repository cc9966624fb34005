"""What a killed writer leaves in an output directory, put right: one repair for the drain and collect.

The ordered commit (hsextract.output.commit) renames a sample's durable temporary file to its
final name, fsyncs the directories, then appends its manifest row. A kill, or a power cut, at any
instant of it leaves at most three things, each repaired here when the next writer starts:

* a torn last line of a journal (``manifest.jsonl``, ``collect-failures.jsonl``): cut off, so
  that the next append starts on a line of its own (`repair_torn_tail`, `cut_torn_tail`);
* sample files at output indices the manifest has not reached (renamed, never recorded; the
  renames go in index order, so they are contiguous): removed, and their samples are written
  again under the same numbers (`remove_orphans`);
* temporary files of samples never renamed: removed (`clear_temporary`).

The drain (hsextract.drain.recovery) and collect (hsextract.collect.runner) call these at their
start, each saying in its own words what it repaired.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from hsextract.durable import fsync_dir
from hsextract.output.layout import manifest_entries_path


def cut_torn_tail(path: Path) -> int:
    """Cut a last line without its newline (an append killed midway) off the journal at `path`,
    durably; return the bytes removed (0 for a missing file)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    keep = data.rfind(b"\n") + 1
    torn = len(data) - keep
    if torn:
        with open(path, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    return torn


def repair_torn_tail(output_dir: str | Path) -> int:
    """Cut a torn last line off the manifest (left by a crash mid-append); return the bytes removed."""
    return cut_torn_tail(manifest_entries_path(output_dir))


def remove_orphans(out: Path, relative_path: Callable[[int], str], count: int) -> list[str]:
    """Remove the sample files at output indices `count` on (the manifest's length), which a
    killed commit renamed but never recorded; return their names, relative to `out`."""
    removed = []
    i = count
    while True:
        p = out / relative_path(i)
        if not p.exists():
            break
        p.unlink()
        fsync_dir(p.parent)
        removed.append(str(p.relative_to(out)))
        i += 1
    return removed


def clear_temporary(d: Path) -> int:
    """Empty a temporary directory of what a killed writer left there (create it if needed; an
    empty one is left as it is); return how many entries were removed."""
    d.mkdir(parents=True, exist_ok=True)
    removed = 0
    for p in list(d.iterdir()):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed += 1
    return removed
