"""The ``hsextract`` command line: one subcommand per job, each defined next to the code it drives.

Subcommand modules are imported lazily, so a subcommand's heavy imports (torch, transformers)
are paid only when it runs, and ``hsextract --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import select
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from hsextract import __version__, shutdown
from hsextract.errors import HsextractError

# name -> (module that defines `add_arguments(parser)` and `run(args) -> int`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "extract": ("hsextract.client.command", "send a dataset to the server as prefill requests (resumable)"),
    "regenerate": ("hsextract.regen.command", "let the served model write a dataset's replies (resumable)"),
    "drain": ("hsextract.drain.command", "move staged dumps into the training set (daemon)"),
    "finalize": ("hsextract.drain.finalize_command", "write the dataset-level files of an output directory"),
    "draft-config": ("hsextract.draft_command", "write a set's EAGLE-3 draft config and SpecForge run file"),
    "pull": ("hsextract.objectstore.pull", "download a set from a bucket into a directory, every object checked"),
    "collect": ("hsextract.collect.command", "bring many hosts' training sets into one, verified (resumable)"),
    "fleet": ("hsextract.fleet.command", "judge the hosts of a fleet as one run: their plans, their progress"),
    "plan": ("hsextract.plan.command", "size a run from its dataset before starting it (bytes, time, room)"),
    "status": ("hsextract.status", "show the progress of a run"),
    "selfcheck": ("hsextract.capture.selfcheck_command", "check a staged dump against the model (smoke test)"),
    "capture-patch": ("hsextract.capture.patch", "render the capture package for SGLang"),
    "reap-port": ("hsextract.ops.reap_port", "stop the processes that hold a TCP port"),
    "check-shm": ("hsextract.ops.check_shm", "check /dev/shm has the space a run needs"),
    "make-tiny-model": ("hsextract.tiny_model", "generate a tiny random-weight model for tests and demos"),
}


EX_IOERR = 74  # sysexits.h: an input/output error
# What a shell reports for a command killed by SIGPIPE (`yes | head -1`): the status of a command
# whose reader stopped reading (`hsextract status | head -1`), which is no error of the command's.
EXIT_READER_GONE = 128 + signal.SIGPIPE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hsextract", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"hsextract {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_) in COMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None, *, exiting: bool = False) -> int:
    """Run one subcommand; ``exiting`` says the process ends right after (the ``hsextract`` command)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Parse the top level only, then hand the rest to the subcommand's own parser.
    top, rest = parser.parse_known_args(argv)
    if not top.command:
        parser.print_help()
        return 2
    # (Again, for a caller other than `python -m hsextract`: the handlers it replaces come back after.)
    previous = shutdown.install(shutdown.GRACEFUL_STOP.get(top.command, ()))
    try:
        return _run(top, rest)
    except BrokenPipeError:  # raised again by `_run` only when stdout's reader is gone
        return _reader_gone()
    finally:
        if exiting:
            shutdown.ignore_from_now()
        else:
            shutdown.restore(previous)


def entry() -> NoReturn:
    """The ``hsextract`` command and ``python -m hsextract``.

    Python ignores SIGPIPE, so a reader that stops reading (``hsextract status | head -1``) shows
    up as a BrokenPipeError: at a write inside the command, or when the interpreter flushes stdout
    at exit, where it could only print a traceback. Stdout is flushed here instead, and either way
    the command ends as one killed by SIGPIPE would, silently with status 141.
    """
    try:
        try:
            code = main(exiting=True)
        except SystemExit as done:  # argparse's --help, --version and usage errors
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 2)
        sys.stdout.flush()
    except BrokenPipeError:
        code = _reader_gone()
    sys.exit(code)


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or socket whose reading end was closed."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # replaced by a test's capture, or closed
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _reader_gone() -> int:
    """Point stdout at /dev/null, so that nothing else tries to write to the closed pipe (the
    interpreter's last flush included); the status of a command killed by SIGPIPE."""
    with open(os.devnull, "wb") as devnull:
        os.dup2(devnull.fileno(), sys.stdout.fileno())
    return EXIT_READER_GONE


# Options whose value may start with '-' (a negative layer id is a value, wrongly, not a flag:
# it must reach the range check that says what is valid).
_VALUE_OPTIONS = ("--aux-layers", "--aux-layer-ids")
_NUMBER_LIST = re.compile(r"^-?\d+(,\s*-?\d+)*$")


def attach_option_values(argv: list[str]) -> list[str]:
    """``--aux-layers -1,2,3`` -> ``--aux-layers=-1,2,3`` (argparse takes ``-1,2,3`` for a flag)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in _VALUE_OPTIONS and i + 1 < len(argv) and _NUMBER_LIST.match(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def _run(top: argparse.Namespace, rest: list[str]) -> int:
    module_name, help_ = COMMANDS[top.command]
    module = importlib.import_module(module_name)
    sub = argparse.ArgumentParser(prog=f"hsextract {top.command}", description=help_)
    module.add_arguments(sub)
    rest = attach_option_values(rest)
    args = sub.parse_args(rest)
    logging.basicConfig(
        level=logging.DEBUG if top.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if hasattr(args, "config"):
            from hsextract.config_file import apply_config

            args = apply_config(sub, args, rest)
        return int(module.run(args) or 0)
    except HsextractError as exc:
        print(f"hsextract {top.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        if isinstance(exc, BrokenPipeError) and stdout_reader_gone():
            raise  # not the command's error: the one reading its output stopped (see `entry`)
        # A file the command needs cannot be read or written (a read-only or full volume, a
        # permission): say which and why, not a traceback.
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"hsextract {top.command}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EX_IOERR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    entry()
