"""The ``--into`` directory: a new or empty one, or a set collect made; never anything else.

A collect writes the set's card (``README.md``), the speculators Arrow dataset (``state.json``,
``data-*.arrow``), the format's sample files, and removes sample files past its manifest's end
(those a killed collect renamed but never recorded). In a directory of something else (a project,
a drain's training set, another tool's data) that overwrites and removes what is not its own. So a
collect writes only into a directory that

* does not exist, or is empty, or holds only what a collect that admitted no host leaves there (its
  lock, ``.hsextract/output.lock``); or
* holds ``.hsextract/collect-state.json``, which a collect writes (`mark`) before anything else of
  the set, once it has admitted a host, so that a set a collect was killed in is still its own.

Anything else is refused before the lock is taken, naming the directory and what is in it.
"""

from __future__ import annotations

import os
from pathlib import Path

from hsextract.durable import atomic_write_json
from hsextract.errors import ConfigError
from hsextract.output.layout import MANIFEST_HEADER, OUTPUT_LOCK, STATE_DIR, collect_state_path


def is_collected_set(out: Path) -> bool:
    """Whether a collect made `out` (its mark, written before anything else of the set)."""
    return collect_state_path(out).is_file()


def check_into(out: Path) -> None:
    """ConfigError unless `out` may be written by a collect (see the module docstring)."""
    if not out.exists() or is_collected_set(out):
        return
    if not out.is_dir():
        raise ConfigError(f"--into {out} is not a directory: give a new or empty directory, or a set collect made")
    try:
        found = _contents(out)
    except OSError:  # unreadable: check_writable, next, says so with the fix
        return
    if not found:
        return
    what = f"{', '.join(found[:8])}{' ...' if len(found) > 8 else ''}"
    if (out / MANIFEST_HEADER).exists():
        what += f"; its {MANIFEST_HEADER} is a training set's that no collect made (a drain's output?)"
    raise ConfigError(
        f"--into {out} is not empty and holds no collected set (no {collect_state_path(out).relative_to(out)}): "
        f"found {what}. A collect writes its own README.md, state.json and sample files there and removes sample "
        "files it did not record: collect into a new or empty directory, or into a set collect made"
    )


def mark(out: Path) -> None:
    """Make `out` a collected set (`is_collected_set`), before anything else of the set is written."""
    if not is_collected_set(out):
        atomic_write_json(collect_state_path(out), {})


def _contents(out: Path) -> list[str]:
    """The entries of `out` but what a refused collect leaves (directories end in "/"); a directory's
    top level only, so a large one is not walked."""
    found = []
    for name in sorted(os.listdir(out)):
        is_dir = (out / name).is_dir() and not (out / name).is_symlink()
        if name == STATE_DIR and is_dir and set(os.listdir(out / name)) <= {OUTPUT_LOCK}:
            continue
        found.append(f"{name}/" if is_dir else name)
    return found
