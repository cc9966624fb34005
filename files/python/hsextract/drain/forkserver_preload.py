"""What the drain's forkserver loads once, before it forks the worker processes
(hsextract.drain.worker_processes). Imported only there: importing it anywhere else would make that
process deaf to SIGTERM.

Why a forkserver: a fresh interpreter per worker imports torch on its own, and eight of them at once
took 9-11 s on the H200 host's 16 cores (25-32 s on 2 cores), during which the drain wrote only
from its own threads: its first seconds ran at half its steady rate (issue 40). Forked from one
interpreter that has imported everything, each worker is up in milliseconds. The server is itself
a fresh interpreter (not a fork of the drain, whose threads may hold locks at the moment of a fork).

Why it ignores SIGTERM: systemd's stop sends SIGTERM to every process of the unit. A forkserver
that died of it would take the pool with it: the pool learns of its workers' ends through the
server, so every worker would look dead while it finishes the samples in hand. The stop is the
drain's to carry out; the server ends by itself once the drain has exited (its liveness pipe
closes). The signals arrive blocked (hsextract.drain.forkserver.start) and are unblocked here,
once ignored.
"""

from __future__ import annotations

import signal

for _sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(_sig, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})

import importlib  # noqa: E402

import numpy  # noqa: E402, F401
import torch  # noqa: E402, F401

import hsextract.drain.prepare  # noqa: E402
import hsextract.drain.warmup  # noqa: E402, F401
from hsextract.formats import FORMATS  # noqa: E402

for _spec in FORMATS.values():  # every format's writer: the server serves any of them
    importlib.import_module(_spec.writer.split(":")[0])
