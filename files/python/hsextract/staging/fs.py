"""Making and opening what lies in the staging directory, without trusting what is already there.

The staging directory sits on a RAM disk that every local user may write (``/dev/shm``, mode
1777), and hsextract's services run as root or as a service user. Any local user can create
``/dev/shm/hsextract`` before the service does (after a reboot, say) and plant symbolic links in
it, named as the dumps of a run whose id is in the world-readable ``run.json``; a writer that
opens ``<rid>/states.safetensors`` through whatever is there then overwrites the link's target as
the service's user. Every process that writes staging (the capture and its writer process, the
client, the drain) goes through this module:

* the staging root is created mode 0700 (`prepare_root`), and one that exists is used only if it
  belongs to this process's user and neither its group nor others may write it (`check_root`):
  anything else might hold what another user planted, so it is refused, naming its owner and mode
  and what to do;
* a directory inside it (a request's, ``_records``, ``_captures``) is made with mkdir, mode 0700;
  one that exists already is used only if it is a real directory (not a link) of this user that
  no one else may write (`make_dir`);
* a file is created anew with ``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600, after removing what
  stood under its name (unlink removes a link, never its target) (`create_file`), and an existing
  file is opened with ``O_NOFOLLOW`` (`open_file`): staged dumps hold hidden states and records
  hold the prompts' token ids, which other local users have no business reading;
* a name joined to a staging path is one plain component: never empty, ``.``, ``..`` or with a
  ``/`` (`plain_name`).

Inside a root that passes `check_root`, only this user (and root) can create entries, so a path
checked once stays what it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import secrets
import stat
import threading
from pathlib import Path

from hsextract.errors import ConfigError

DIR_MODE = 0o700
FILE_MODE = 0o600
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeStagingError(ConfigError):
    """The staging root is not safe to write: another user's, or writable by group or others."""


class UnsafeEntryError(OSError):
    """An entry inside the staging directory is not what this process made (a link, another
    user's directory), or a name is not one plain path component. An OSError, so that the
    writers' error paths (a request failed, its reason logged) take it like any write error."""


def user_name(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` where the user database has no entry."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def plain_name(name: str) -> str:
    """`name` if it is one plain path component; else UnsafeEntryError."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UnsafeEntryError(errno.EINVAL, f"{name!r} is not a plain file name; refused in the staging directory")
    return name


def check_root(path: str | Path, flag: str = "--dump-dir") -> None:
    """Refuse a staging root that another user could have filled: one that is not a directory,
    that belongs to another user than this process's, that group or others may write, or that is
    a symbolic link made by another user than this one or root."""
    euid = os.geteuid()
    inspect_root(path, {euid}, f"{user_name(euid)} who runs this process", flag)


def inspect_root(path: str | Path, owners: set[int], whom: str, flag: str = "--dump-dir") -> os.stat_result:
    """The status of staging root `path` (a link followed), once it proves to be a directory of
    one of `owners` (`whom`, in words) that neither group nor others may write, reached through no
    link but one of an owner or root; else UnsafeStagingError saying what is wrong and what to do."""
    p = Path(path)
    try:
        link = os.lstat(p)
        st = os.stat(p)
    except OSError as exc:
        raise UnsafeStagingError(
            f"staging directory {p}: cannot inspect it ({exc.strerror or exc}); choose another {flag}"
        ) from exc
    redo = (
        f"Remove it (rm -rf {p}) so that hsextract creates it anew (mode 0700, owned by the user that runs "
        f"it), or choose another {flag}"
    )
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (*owners, 0):
        raise UnsafeStagingError(
            f"staging directory {p} is a symbolic link made by {user_name(link.st_uid)}, not by {whom}. {redo}"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStagingError(f"staging directory {p} is not a directory. {redo}")
    if st.st_uid not in owners:
        raise UnsafeStagingError(
            f"staging directory {p} belongs to {user_name(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}, not to "
            f"{whom}: its owner may have planted links in it that would be written through. {redo}; the capture, "
            "the client and the drain must run as one user"
        )
    if st.st_mode & _OTHERS_WRITE:
        raise UnsafeStagingError(
            f"staging directory {p} has mode {stat.S_IMODE(st.st_mode):04o}: its group or others may write into it "
            f"and plant links there. {redo}, or chmod 0700 it once you have checked what it holds (a tmpfs mounted "
            "there for staging needs mode=0700 among its mount options)"
        )
    return st


def prepare_root(
    path: str | Path, *, create: bool = True, what: str = "staging directory", flag: str = "--dump-dir"
) -> Path:
    """The staging root, created mode 0700 if missing (when `create`; its missing parents as
    mkdir -p makes them), checked by `check_root`, and proven writable."""
    p = Path(path)
    if create:
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(p, DIR_MODE)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ConfigError(
                f"{what} {p} is not writable ({exc.strerror or exc}); give the user that runs this "
                f"process write access to {p.parent}, or choose another {flag}"
            ) from exc
    check_root(p, flag)
    probe_writable(p, what, flag)
    return p


def check_own_dir(path: str) -> None:
    """Refuse an existing directory inside the staging root that this process's user did not make
    as `make_dir` makes one: a link, another user's, or writable by group or others."""
    st = os.lstat(path)
    problem = ""
    if not stat.S_ISDIR(st.st_mode):
        problem = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
    elif st.st_uid != os.geteuid():
        problem = f"a directory of {user_name(st.st_uid)}"
    elif st.st_mode & _OTHERS_WRITE:
        problem = f"a directory of mode {stat.S_IMODE(st.st_mode):04o} (group or others may write it)"
    if problem:
        raise UnsafeEntryError(
            errno.EEXIST, f"{path} exists and is {problem}, not a directory that hsextract made; refused (remove it)"
        )


def make_dir(parent: str | Path, name: str) -> tuple[str, bool]:
    """Make directory `name` in `parent` (mode 0700); return its path and whether it is new. An
    existing one is used only if it passes `check_own_dir`."""
    path = f"{os.fspath(parent)}/{plain_name(name)}"
    try:
        os.mkdir(path, DIR_MODE)
        return path, True
    except FileExistsError:
        check_own_dir(path)
        return path, False


def create_file(path: str) -> int:
    """A write descriptor on a new file at `path` (mode 0600), after removing whatever stood there;
    never opened through a link."""
    try:
        return os.open(path, _NEW_FILE, FILE_MODE)
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return os.open(path, _NEW_FILE, FILE_MODE)


def open_file(path: str, flags: int) -> int:
    """A descriptor on an existing file at `path`, refusing a link in its place (ELOOP)."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)


def write_file_atomically(path: str, data: bytes) -> None:
    """Replace `path` with `data` (mode 0600) under a temporary name first, then rename: a reader
    sees the old file or the whole new one. One writer per path at a time (the temporary name is
    fixed): the capture writes a request's markers from one thread."""
    head, tail = os.path.split(path)
    tmp = f"{head}/.{tail}.tmp"
    fd = create_file(tmp)
    try:
        if os.write(fd, data) != len(data):  # a few hundred bytes: short only on a full volume
            raise OSError(errno.ENOSPC, f"short write of {tmp}")
    finally:
        os.close(fd)
    os.replace(tmp, path)


def probe_writable(root: str | Path, what: str = "staging directory", flag: str = "--dump-dir") -> None:
    """Prove that this process can create a file in `root`, or raise a ConfigError saying so."""
    # One name per call: threads of one process that prepare the root at once (the first records
    # of a run, written from several threads) each probe with a file of their own.
    probe = f"{os.fspath(root)}/.hsextract-write-probe-{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}"
    try:
        os.close(create_file(probe))
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"{what} {root} is not writable ({exc.strerror or exc}); give the user that runs this "
            f"process write access, or choose another {flag}"
        ) from exc
