"""The directory a pull writes into, claimed without trusting what stands in it already.

A pull often runs as root, into a path under ``/tmp``, ``/dev/shm`` or another user's directory,
which whoever could write there may have made first. Its bookkeeping (``.hsextract/``: what the
pull is of, the journal of the objects verified, the temporary downloads) would then be reached
through whatever they planted: a link named ``.hsextract/pulled.jsonl`` makes the journal's
lines land in any file, a link named ``.hsextract/pull-tmp`` the downloads in any directory. So:

* the destination is this user's (or root's) directory that others may not write: the owner of
  a directory, and anyone who may write it, can swap what the pull made there for a link at any
  moment after it was checked;
* ``.hsextract`` is made by the pull with mkdir; one that exists is used only when a pull made it:
  a real directory (not a link) of this process's user that neither group nor others may write,
  holding nothing but a pull's own files, none of them a link or a special file;
* the destination itself is otherwise empty, or an earlier pull of the same source and slice;
* the journal is opened with ``O_NOFOLLOW``, and every download is created anew, never through
  a link (hsextract.objectstore.store.ObjectStore.download).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from hsextract.contained import irregular_entries, read_regular
from hsextract.durable import atomic_write_bytes
from hsextract.errors import ConfigError
from hsextract.output.layout import STATE_DIR, state_dir
from hsextract.staging.fs import UnsafeEntryError, check_own_dir, user_name

PULLED = "pulled.jsonl"
PULL_SOURCE = "pull.json"
PULL_TMP = "pull-tmp"
_JOURNAL_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def claim(dest: Path, source: dict) -> None:
    """`dest` is new (or empty), or an earlier pull of the same source and slice (which this one
    resumes); its ``.hsextract`` is then the pull's own (see the module docstring)."""
    dest.mkdir(parents=True, exist_ok=True)
    _check_dest(dest)
    state = state_dir(dest)
    try:
        os.mkdir(state, 0o755)
        fresh = True
    except FileExistsError:
        fresh = False
        _check_state_dir(state)
    before = None if fresh else _recorded_source(dest)
    if before is None:
        others = sorted(p.name for p in dest.iterdir() if p.name != STATE_DIR)
        if others:
            raise ConfigError(
                f"{dest} is not empty ({', '.join(others[:5])}) and holds no pull: pull into a new directory"
            )
        _write_source(dest, source)
        return
    if (before.get("source"), before.get("samples")) != (source["source"], source["samples"]):
        raise ConfigError(
            f"{dest} holds a pull of {before.get('source')} samples {before.get('samples')}: resume it "
            "with the same source and --samples, or pull into a new directory"
        )
    if bool(before.get("to_bf16")) != bool(source.get("to_bf16")):
        held = "bf16 files converted from its FP8 rows" if before.get("to_bf16") else "its FP8 rows as they are"
        raise ConfigError(
            f"{dest} holds a pull of {before.get('source')} as {held}: resume it "
            f"{'with' if before.get('to_bf16') else 'without'} --to-bf16, or pull into a new directory"
        )
    if before.get("to_bf16") and before.get("format") != source.get("format"):
        raise ConfigError(
            f"{dest} holds a pull of {before.get('source')} as bf16 files of the {before.get('format')} format: "
            f"resume it with --format {before.get('format')}, or pull into a new directory"
        )
    _write_source(dest, source)


def tmp_dir(dest: Path) -> Path:
    """``.hsextract/pull-tmp``, made by mkdir, or one a pull made (`check_own_dir`)."""
    path = state_dir(dest) / PULL_TMP
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        _checked_own(path)
    return path


def append_journal(dest: Path, line: str) -> None:
    """Append `line` to the journal of verified objects, never through a link."""
    fd = os.open(state_dir(dest) / PULLED, _JOURNAL_FLAGS, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def journal_text(dest: Path) -> str:
    """The journal of verified objects, read without following a link ('' when there is none)."""
    try:
        return read_regular(dest, f"{STATE_DIR}/{PULLED}").decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def _check_dest(dest: Path) -> None:
    st = os.stat(dest)
    if st.st_uid not in (os.geteuid(), 0):
        problem = f"belongs to {user_name(st.st_uid)}"
    elif st.st_mode & stat.S_IWOTH:
        problem = f"has mode {stat.S_IMODE(st.st_mode):04o}: others may write into it"
    else:
        return
    raise ConfigError(
        f"{dest} {problem}, who could put links in place of what the pull writes there: pull into a new directory "
        "of your own"
    )


def _check_state_dir(state: Path) -> None:
    _checked_own(state)
    names = sorted(os.listdir(state))
    planted = irregular_entries(state.parent, [f"{STATE_DIR}/{n}" for n in names])
    if planted:
        raise ConfigError(
            f"{state} holds what no pull makes ({'; '.join(planted[:3])}): a pull writes nothing through a "
            "link. Remove it (rm -rf), or pull into a new directory"
        )
    if names and PULL_SOURCE not in names:
        raise ConfigError(
            f"{state} exists and was not made by a pull (it has no {PULL_SOURCE}: {', '.join(names[:5])}): "
            "pull into a new directory"
        )


def _checked_own(path: Path) -> None:
    try:
        check_own_dir(str(path))
    except UnsafeEntryError as exc:
        raise ConfigError(f"{exc.strerror}; pull into a new directory, or remove it first") from None


def _recorded_source(dest: Path) -> dict | None:
    try:
        data = json.loads(read_regular(dest, f"{STATE_DIR}/{PULL_SOURCE}"))
    except FileNotFoundError:
        return None
    except ValueError:
        raise ConfigError(f"{state_dir(dest) / PULL_SOURCE}: not a pull's record; pull into a new directory") from None
    return data if isinstance(data, dict) else None


def _write_source(dest: Path, source: dict) -> None:
    # A temporary name of its own, created exclusively, then renamed: a link at the name is replaced.
    atomic_write_bytes(state_dir(dest) / PULL_SOURCE, json.dumps(source).encode())
