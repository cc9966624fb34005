"""One run configuration file shared by every subcommand.

The Ansible roles write a single JSON file per host (model, dump dir, output, format, layers,
rid prefix...) and every ``hsextract`` subcommand reads the keys it knows from it, so the server
patch, the client and the drain can never disagree. Command-line flags override the file.
Keys use the flag names with dashes replaced by underscores (``dump_dir``, ``rid_prefix``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    given = set()
    for token in argv or []:
        if token.startswith("--"):
            given.add(token[2:].split("=", 1)[0].replace("-", "_"))
    for action in parser._actions:
        dest = action.dest
        if dest in ("help", "config") or dest in given or dest not in data:
            continue
        value = data[dest]
        if action.type is not None and value is not None and not isinstance(value, (list, bool)):
            try:
                value = action.type(value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"config file {path}: {dest}={value!r} is invalid ({exc})") from exc
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(str, action.choices))
            raise ConfigError(f"config file {path}: {dest}={value!r}; expected one of {choices}")
        setattr(args, dest, value)
    return args
