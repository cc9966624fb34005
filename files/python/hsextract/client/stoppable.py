"""Steps of the client's start that a stop must not wait for.

systemd stops a unit with SIGTERM at any instant, and a client that starts by loading a tokenizer
(transformers' import alone takes seconds), counting the rows of a dataset of hundreds of GB and
waiting for its probe's dump would answer the stop only once all of that is done: 9-12 s on a
small model, minutes on a large dataset. Such a step runs in a daemon thread while the caller
waits for it or for the stop, whichever comes first; on a stop the caller goes on (to exit) and
the step is abandoned: these steps only read, so nothing is left half written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from hsextract.client.sender import StopRequested

T = TypeVar("T")

_POLL_S = 0.05


def call_unless_stopped(stop: threading.Event, what: str, fn: Callable[[], T]) -> T:
    """``fn()``, or StopRequested as soon as `stop` is set (at once if it is set already)."""
    if stop.is_set():
        raise StopRequested(f"asked to stop before {what}")
    result: list[T] = []
    error: list[BaseException] = []
    done = threading.Event()

    def work() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            error.append(exc)
        finally:
            done.set()

    threading.Thread(target=work, name=f"hsextract-{what.replace(' ', '-')}", daemon=True).start()
    while not done.wait(_POLL_S):
        if stop.is_set():
            raise StopRequested(f"asked to stop while {what}")
    if error:
        raise error[0]
    return result[0]
