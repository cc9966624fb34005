"""Make the staging directory for a service's user, or refuse one that another user made:
``python -m hsextract.ops.staging_root --owner USER PATH``.

The server's and the drain's units run it as root before their process starts (``ExecStartPre=+``),
where ``install -d -o USER`` stood: that gave a directory another user had made first (any local
user can create ``/dev/shm/hsextract`` after a reboot) to the service's user, with whatever links
were planted in it. Here a missing directory is made mode 0700 and given to USER; an existing one is
taken only if it is USER's or root's, and neither group nor others may write it (then it is given to
USER, mode 0700); anything else is refused, saying why and what to do (`hsextract.staging.fs`).
Exit 0 when the directory is ready, 1 when refused. Standard library and hsextract.staging.fs only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import sys
from pathlib import Path

from hsextract.errors import ConfigError
from hsextract.staging.fs import DIR_MODE, inspect_root, user_name


def ensure(path: Path, owner: str) -> None:
    """Make or take `path` for `owner` (see the module docstring); ConfigError when refused."""
    try:
        user = pwd.getpwnam(owner)
    except KeyError:
        raise ConfigError(f"no user {owner!r} on this host to own the staging directory {path}") from None
    if not os.path.lexists(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # made since: inspected below like any existing one
            os.mkdir(path, DIR_MODE)
    inspect_root(
        path, {user.pw_uid, 0}, f"{user_name(user.pw_uid)}, the services' user, or root", flag="hsextract_dump_dir"
    )
    os.chown(path, user.pw_uid, user.pw_gid)
    os.chmod(path, DIR_MODE)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hsextract.ops.staging_root",
        description="make the staging directory for a service's user, or refuse another's",
    )
    ap.add_argument("--owner", required=True, help="the user the services run as")
    ap.add_argument("path", type=Path, help="the staging directory (hsextract_dump_dir)")
    args = ap.parse_args(argv)
    try:
        ensure(args.path, args.owner)
    except (ConfigError, OSError) as exc:
        print(f"hsextract: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
