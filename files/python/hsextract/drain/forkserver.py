"""The drain's forkserver: the one interpreter its worker processes are forked from
(hsextract.drain.worker_processes), which imports torch and every format once
(hsextract.drain.forkserver_preload).

Why `start` exists: the server's imports and the drain's own (torch again, through the formats)
take about a second each. Left to the worker pool, which is built once the drain has imported
everything and recovered its output, the server began its imports only after the drain's were
done, and 8 workers were up 2.7-2.9 s after the drain's start on 2 cores (1.4-1.5 s since). `hsextract drain` calls
`start` before it imports the drain, so that the two imports run side by side; the pool then finds
the server running and forks its workers from it. This module imports nothing heavy.

SIGINT and SIGTERM are blocked while the server is spawned: it inherits the mask, so a stop that
comes during its imports waits until the preload, having set both signals to be ignored, unblocks
them (the stop is the drain's to carry out). The calling thread's mask is restored at once.
"""

from __future__ import annotations

import multiprocessing
import signal
from multiprocessing import forkserver

__all__ = ["PRELOAD", "STOP_SIGNALS", "context", "start"]

PRELOAD = "hsextract.drain.forkserver_preload"
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def context() -> multiprocessing.context.ForkServerContext:
    """The forkserver context, its preload set. The preload is read when the server starts: a server
    already running serves as it is (the workers' own start imports what they need)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([PRELOAD])
    return ctx


def start() -> None:
    """Start the server now, in the background (it imports while the caller goes on); a server
    already running is left as it is."""
    context()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
