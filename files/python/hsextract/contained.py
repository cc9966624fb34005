"""Paths another party wrote, opened only inside the directory they belong to.

A host output's manifest names each sample's file, and its quarantine and bookkeeping files are
whatever its drain (or whoever controls that host) left there. ``hsextract collect`` reads them as
root on the collector and ``--move`` removes them, so a name such as ``../../etc/shadow``, an
absolute path, or a symbolic link (``reason.txt -> /etc/hostname``) would read or remove the
collector's own files. Every reader of such a path goes through this module:

* `checked_parts`: the name must be a relative POSIX path of plain components: not empty, not
  absolute, no ``.`` or ``..`` component, no empty component, no NUL;
* `open_regular`: it is opened component by component below the root with ``O_NOFOLLOW``, so no
  symbolic link is followed anywhere on the way, and the file must be a regular file (a FIFO
  would block the reader, a device would read the collector's disk);
* `unlink_regular` removes only a regular file reached the same way, so what it removes lies inside
  the root whatever the name says;
* `irregular_entries` lists the symbolic links and special files of a tree (``lstat``), to refuse
  a host output whose bookkeeping holds one before anything of it is read.

Checking the resolved path and then opening it would leave a window in which a component is
swapped for a link; opening each component relative to its parent's descriptor leaves none.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from hsextract.errors import HsextractError

# Opening a FIFO for reading blocks until a writer comes; O_NONBLOCK makes the open return, and the
# fstat that follows refuses it. It changes nothing for a regular file.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(HsextractError):
    """A path that is not a regular file inside the directory it must be in (its message says why)."""


def checked_parts(rel: object) -> list[str]:
    """The components of `rel`, a relative path of plain components; UnsafePath otherwise."""
    if not isinstance(rel, str) or not rel:
        raise UnsafePath(f"{rel!r} is not a file name")
    if "\0" in rel:
        raise UnsafePath(f"{rel!r} holds a NUL byte")
    if rel.startswith("/"):
        raise UnsafePath(f"{rel!r} is an absolute path, not one inside the directory")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePath(f"{rel!r} has an empty, '.' or '..' component: only plain names inside the directory")
    return parts


def kind_of(mode: int) -> str:
    """What a file of this mode is, in a refusal's words."""
    for test, word in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return word
    return "a special file"


@contextlib.contextmanager
def _parent_fd(root: Path, parts: Sequence[str], rel: str) -> Iterator[int]:
    """A descriptor of the directory that holds the last of `parts`, reached from `root` (which
    the operator named, so it may itself be a link) without following any link below it."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts[:-1]):
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                mode = os.lstat(name, dir_fd=fd).st_mode
                if stat.S_ISREG(mode):
                    raise  # NotADirectoryError: a plain file where a directory was expected
                sub = "/".join(parts[: i + 1])
                raise UnsafePath(f"{rel!r}: {sub} is {kind_of(mode)}, not a directory; not followed") from None
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def open_regular(root: Path, rel: str) -> int:
    """A read-only descriptor of the regular file `rel` inside `root` (see the module docstring);
    UnsafePath when `rel` is not one, FileNotFoundError when it does not exist."""
    parts = checked_parts(rel)
    with _parent_fd(root, parts, rel) as parent:
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise UnsafePath(f"{rel!r} is a symbolic link: not followed") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafePath(f"{rel!r} is {kind_of(mode)}, not a regular file: not read")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(root: Path, rel: str) -> bytes:
    """The bytes of the regular file `rel` inside `root` (`open_regular`'s rules)."""
    fd = open_regular(root, rel)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def fd_path(fd: int) -> Path:
    """A name that opens exactly the file of `fd` (the kernel's link to it), for readers that take a
    path: nothing in it can be swapped for a link after `open_regular` checked the file."""
    return Path(f"/proc/self/fd/{fd}")


def link_regular(root: Path, rel: str, dst: Path) -> None:
    """Hard-link the regular file `rel` inside `root` to `dst` (`open_regular`'s rules). The name is
    linked as it is, never a link's target; should it have become a link since it was checked, what
    was linked is that link itself, which is removed again and refused."""
    parts = checked_parts(rel)
    with _parent_fd(root, parts, rel) as parent:
        mode = os.lstat(parts[-1], dir_fd=parent).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafePath(f"{rel!r} is {kind_of(mode)}, not a regular file: not linked")
        os.link(parts[-1], dst, src_dir_fd=parent, follow_symlinks=False)
    mode = os.lstat(dst).st_mode
    if not stat.S_ISREG(mode):
        os.unlink(dst)
        raise UnsafePath(f"{rel!r} became {kind_of(mode)} while it was linked: not linked")


def list_dir(root: Path, rel: str) -> list[str]:
    """The names in the directory `rel` inside `root`, reached without following a link (sorted;
    UnsafePath when it or a directory on the way is a link, FileNotFoundError when it is not there)."""
    parts = checked_parts(rel)
    with _parent_fd(root, [*parts, "."], rel) as fd:
        return sorted(os.listdir(fd))


def unlink_regular(root: Path, rel: str) -> bool:
    """Remove the regular file `rel` inside `root`; False when it is not there. UnsafePath, and
    nothing removed, when `rel` is not a plain path inside `root` or not a regular file."""
    parts = checked_parts(rel)
    try:
        with _parent_fd(root, parts, rel) as parent:
            try:
                mode = os.lstat(parts[-1], dir_fd=parent).st_mode
            except FileNotFoundError:
                return False
            if not stat.S_ISREG(mode):
                raise UnsafePath(f"{rel!r} is {kind_of(mode)}, not a regular file: not removed")
            os.unlink(parts[-1], dir_fd=parent)
            return True
    except (FileNotFoundError, NotADirectoryError):  # no directory on the way: no file there either
        return False


def irregular_entries(root: Path, names: Sequence[str]) -> list[str]:
    """``"<path> is <kind>"`` for each symbolic link or special file at the `names` of `root` or below
    them (directories are walked, links never followed); empty when there is none."""
    found: list[str] = []
    for name in names:
        checked_parts(name)
        _walk(root, name, found)
    return found


def _walk(root: Path, rel: str, found: list[str]) -> None:
    try:
        mode = os.lstat(root / rel).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        try:
            children = sorted(os.listdir(root / rel))
        except FileNotFoundError:
            return
        except OSError as exc:  # what cannot be looked at cannot be vouched for
            found.append(f"{rel} cannot be listed ({exc.strerror or exc})")
            return
        for child in children:
            _walk(root, f"{rel}/{child}", found)
    elif not stat.S_ISREG(mode):
        found.append(f"{rel} is {kind_of(mode)}")
