"""One run configuration file shared by every subcommand.

The Ansible roles write a single JSON file per host (model, dump dir, output, format, layers,
rid prefix...) and every ``hsextract`` subcommand reads the keys it knows from it, so the server
patch, the client and the drain can never disagree. Command-line flags override the file.
Keys use the flag names with dashes replaced by underscores (``dump_dir``, ``rid_prefix``).

A key that no subcommand reads is refused, naming the key, the file and line, and the nearest
known key: a misspelt ``uplods`` would otherwise keep the default without a word. Keys that begin
with ``_`` are comments (the roles write ``_comment``). A key another subcommand reads is not
this one's business: the file is shared.
"""

from __future__ import annotations

import argparse
import difflib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hsextract.config_keys import KNOWN_KEYS
from hsextract.errors import ConfigError


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="JSON run configuration; flags given on the command line win")


def load_config_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except ValueError as exc:
        raise ConfigError(f"config file {p}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p}: expected a JSON object at the top level")
    return data


def apply_config(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """Fill in values from ``args.config`` for options that were left at their defaults."""
    path = getattr(args, "config", None)
    if not path:
        return args
    data = load_config_file(path)
    check_keys(path, data)
    given = set()
    for token in argv or []:
        if token.startswith("--"):
            given.add(token[2:].split("=", 1)[0].replace("-", "_"))
    for action in parser._actions:
        dest = action.dest
        if dest in ("help", "config") or dest in given or dest not in data:
            continue
        value = data[dest]
        convert = action.type
        if callable(convert) and value is not None and not isinstance(value, (list, bool)):
            try:
                value = convert(value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"config file {path}: {dest}={value!r} is invalid ({exc})") from exc
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(str, action.choices))
            raise ConfigError(f"config file {path}: {dest}={value!r}; expected one of {choices}")
        setattr(args, dest, value)
    return args


def check_keys(path: str | Path, data: dict[str, Any]) -> None:
    """ConfigError for the first key of `data` that no subcommand reads (see the module docstring)."""
    for key in data:
        if key.startswith("_") or key in KNOWN_KEYS:
            continue
        near = difflib.get_close_matches(key, sorted(KNOWN_KEYS), n=1, cutoff=0.6)
        hint = f"did you mean {near[0]!r}?" if near else "no known key is near it"
        raise ConfigError(
            f"config file {path}{_line_of(path, key)}: unknown key {key!r} ({hint}); keys are the subcommands' "
            "flags with '_' for '-' (`hsextract <command> --help`), and keys beginning with '_' are comments"
        )


def _line_of(path: str | Path, key: str) -> str:
    """`` line N`` where the key stands in the file, or '' when it cannot be told."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return ""
    quoted = json.dumps(key)
    for n, line in enumerate(lines, 1):
        at = line.find(quoted)
        if at >= 0 and line[at + len(quoted) :].lstrip().startswith(":"):
            return f" line {n}"
    return ""
