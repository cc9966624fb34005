"""The staging directory's own names: where the client's records and the captures' announcements lie.

::

    <dump_dir>/                        the staging directory (/dev/shm)
      <rid>/                            a staged dump: its files and markers are hsextract.staging.dumps's
      _records/<rid>.json               the client's record of a sample (hsextract.staging.records)
      _captures/<host>-<pid>.json       each writing capture's description of itself
                                        (hsextract.staging.announcements)
"""

from __future__ import annotations

from pathlib import Path

from hsextract.staging.fs import plain_name

RECORDS_DIR = "_records"
RECORD_SUFFIX = ".json"  # _records/<rid>.json
CAPTURES_DIR = "_captures"


def records_dir(dump_dir: str | Path) -> Path:
    return Path(dump_dir) / RECORDS_DIR


def record_path(dump_dir: str | Path, rid: str) -> Path:
    """The record of `rid`; UnsafeEntryError for a rid that would name another place."""
    return records_dir(dump_dir) / plain_name(f"{rid}{RECORD_SUFFIX}")


def record_rid(name: str) -> str | None:
    """The rid a file name in the records directory is the record of; None for other files
    (a writer's hidden temporary file among them)."""
    if name.startswith(".") or not name.endswith(RECORD_SUFFIX):
        return None
    return name[: -len(RECORD_SUFFIX)]


def captures_dir(dump_dir: str | Path) -> Path:
    return Path(dump_dir) / CAPTURES_DIR
