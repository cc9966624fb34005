"""What a client's start may change in the output directory's client files, and when.

A client start is not yet a run: it checks the output (format, dataset, run id), waits for the
server and sends its probe (hsextract.client.probe), and any of these may refuse it, or a stop
may end it. Until they have all passed, the files of the run before it stay as they were: its
summary (a finished run stays finished: ``hsextract status`` and the drain's ``--exit-when-done``
read it), its rejects and failures (the accounts of that run). Only the status file shows the
start under way (waiting for the server, checking the capture), and when the start ends without
a run it gets back the run before it (`record_unstarted`), with the refusal's error beside it
(``start_refused``: ``hsextract status`` shows it and fails on it) if the start was refused.

`begin_run` is the moment the start becomes the run: the summary of the client's shard goes
(the run is not finished any more), and so do the files of shards that overlap it and that no
client runs (the output was extracted with another sharding before: those files speak of
samples this run will now give an outcome to).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path

from hsextract.output.layout import CLIENT_STATUS, CLIENT_SUMMARY, FAILURES, REJECTS, client_files, client_status_path
from hsextract.output.run_files import ClientStatus, write_client_status
from hsextract.shard import Shard


def read_previous(output: Path, shard: Shard) -> ClientStatus | None:
    """The status file of the shard's last client, as it stands before this start (None: none)."""
    return ClientStatus.read(client_status_path(output, shard))


def record_unstarted(
    output: Path, shard: Shard, previous: ClientStatus | None, snapshot: ClientStatus, error: str | None
) -> None:
    """A start that ended before its run began: put the last run's status back, noting the refusal's
    `error` (None for a stop), or, if there was no run before, this start's own final `snapshot`."""
    path = client_status_path(output, shard)
    if previous is None:
        write_client_status(path, snapshot)
        return
    refused = {"error": error, "at": time.time(), "pid": os.getpid()} if error is not None else None
    extra = {k: v for k, v in previous.extra.items() if k != "start_refused"}  # a malformed earlier refusal
    write_client_status(path, dataclasses.replace(previous, start_refused=refused, extra=extra))


def begin_run(output: Path, shard: Shard) -> list[Path]:
    """The start-up checks passed: remove the shard's summary and the superseded files of
    overlapping shards (see the module docstring); return what was removed besides the summary.
    The caller holds its shard's lock, so no running client overlaps it."""
    removed = []
    for base in (CLIENT_SUMMARY, CLIENT_STATUS, REJECTS, FAILURES):
        for named, path in client_files(output, base).items():
            if named == shard:
                if base == CLIENT_SUMMARY:
                    path.unlink(missing_ok=True)  # this run is not finished yet
                continue
            if named.overlaps(shard):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed.append(path)
    return removed
