"""The drain's forkserver: the one interpreter its worker processes are forked from
(hsextract.drain.worker_processes), which imports torch and every format once
(hsextract.drain.forkserver_preload).

Why `start` exists: the server's imports and the drain's own (torch again, through the formats)
take about a second each. Left to the worker pool, which is built once the drain has imported
everything and recovered its output, the server began its imports only after the drain's were
done: 8 workers were up 2.7-2.9 s after the drain's start on 2 cores, and 1.4-1.5 s since
`hsextract drain` calls `start` before it imports the drain, so that the two imports run side by
side. The pool calls it too, and finds the server running. This module imports nothing heavy.

SIGINT and SIGTERM are blocked while the server is spawned: it inherits the mask, so a stop that
comes during its imports waits until the preload, having set both signals to be ignored, unblocks
them (the stop is the drain's to carry out). The calling thread's mask is restored at once; the
workers, forked from the server, inherit what the preload set.
"""

from __future__ import annotations

import multiprocessing
import signal
from multiprocessing import forkserver

__all__ = ["PRELOAD", "STOP_SIGNALS", "start"]

PRELOAD = "hsextract.drain.forkserver_preload"
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def start() -> multiprocessing.context.ForkServerContext:
    """Start the server now, in the background (it imports while the caller goes on), and return its
    context; a server already running is left as it is (its preload was read when it started)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([PRELOAD])
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return ctx
