"""Stop requests for the long-running subcommands (the client and the drain): SIGTERM from systemd.

systemd stops a unit with SIGTERM at any instant, and a stop must end the process cleanly (exit 0,
state ``stopped``) whatever it was doing. Two instants escape a handler installed by the
subcommand itself:

* start-up: the subcommand's imports (torch, transformers) take about a second, and Python's
  default action for SIGTERM is to die. So ``python -m hsextract`` calls `install_early` as its
  first statement (this module imports only `signal` and `threading`), before the CLI and the
  subcommand are imported, and the subcommand picks the request up from `requested()` once it is
  built. What remains is the interpreter's own start, about 40 ms, before any Python code runs;
* shut-down: once ``main`` returns, the interpreter's finalization puts the default action back
  for every signal that has a Python handler, and a SIGTERM during the (slow, torch) exit kills
  the process with -15 although its work is done. `ignore_from_now` switches the signal to
  SIG_IGN, which finalization leaves alone.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable

# Subcommands that finish their work in hand on these signals (systemd's stop) and exit 0.
GRACEFUL_STOP: dict[str, tuple[int, ...]] = {
    "extract": (signal.SIGTERM,),
    "regenerate": (signal.SIGTERM,),
    "drain": (signal.SIGTERM, signal.SIGINT),
}

_requested = threading.Event()
_callbacks: list[Callable[[], None]] = []
_lock = threading.Lock()
_installed: tuple[int, ...] = ()


def requested() -> threading.Event:
    """The event set by the first stop signal (shared by everything in this process)."""
    return _requested


def _handler(signum: int, _frame: object) -> None:
    first = not _requested.is_set()
    _requested.set()
    if first:
        import logging  # not at import time: this module must load before anything heavy

        logging.getLogger("hsextract").info("signal %d: finishing the work in hand, then stopping", signum)
    with _lock:
        callbacks = list(_callbacks)
    for cb in callbacks:
        _run_outside_handler(cb)


def _run_outside_handler(cb: Callable[[], None]) -> None:
    # From another thread: the main thread, which runs the handler, may hold a lock the callback
    # needs (an Event's condition, a queue's mutex), and would deadlock on itself.
    threading.Thread(target=cb, name="hsextract-stop", daemon=True).start()


def install(signals: Iterable[int] = (signal.SIGTERM,)) -> dict[int, object]:
    """Turn the given signals into stop requests (from the main thread, before heavy imports);
    return the handlers they replace, for `restore`."""
    global _installed
    if threading.current_thread() is not threading.main_thread():
        return {}
    sigs = tuple(signals)
    previous = {sig: signal.signal(sig, _handler) for sig in sigs}
    _installed = tuple(dict.fromkeys(_installed + sigs))
    return previous


def install_early(argv: list[str]) -> None:
    """`install` for the subcommand named in ``argv`` (its first word that is not an option), if
    it stops gracefully: called by ``python -m hsextract`` before any other import."""
    command = next((a for a in argv if not a.startswith("-")), "")
    if command in GRACEFUL_STOP:
        install(GRACEFUL_STOP[command])


def on_stop(callback: Callable[[], None]) -> None:
    """Call ``callback`` (in a thread of its own) on a stop request; at once if one came already."""
    with _lock:
        _callbacks.append(callback)
    if _requested.is_set():
        _run_outside_handler(callback)


def ignore_from_now() -> None:
    """Ignore the stop signals for the rest of the process: the work is finished, only the exit is left."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _installed:
        signal.signal(sig, signal.SIG_IGN)


def restore(previous: dict[int, object]) -> None:
    """Put back the handlers `install` replaced and forget requests and callbacks: for a command
    run inside a longer-lived process (the tests), which must not inherit this one's stop."""
    global _installed
    for sig, handler in previous.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]
    _installed = ()
    _requested.clear()
    with _lock:
        _callbacks.clear()
