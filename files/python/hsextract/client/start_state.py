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
client runs (the output was extracted with another split of this host's shard among client
processes: those files speak of samples this run, or its sibling processes, now give an outcome to).

Before that, `check_earlier_shards` refuses a start whose shard would supersede files of a shard
that lies partly outside this client's host shard (``--shard``, which ``--process`` splits): an
output extracted whole and then run with ``--shard 1/3``, say. Those files hold the accounts
(rejects, failures, summary) of samples no client of this host shard will give an outcome to
again, so removing them would leave samples in the set that no account names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path

from hsextract.errors import ConfigError
from hsextract.output.client_files import read_shards
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


class ShardRefused(ConfigError):
    """The output holds the accounts of a shard this client's run would drop: it is not started
    (and writes no status of its shard, which would read as a client of the output that never
    finished)."""


def check_earlier_shards(output: Path, shard: Shard, host_shard: Shard) -> None:
    """ConfigError, before anything changes, when the output holds client files of a shard that
    overlaps `shard` (this client's) but reaches outside `host_shard` (the ``--shard`` it is a
    sub-shard of): see the module docstring."""
    earlier = {s.shard for s in read_shards(output)}
    earlier |= {named for base in (REJECTS, FAILURES) for named in client_files(output, base)}
    clash = sorted(t for t in earlier if t != shard and t.overlaps(shard) and not host_shard.contains(t))
    if not clash:
        return
    shown = ", ".join(map(str, clash))
    of = f" (of --shard {host_shard})" if host_shard != shard else ""
    raise ShardRefused(
        f"output directory {output} holds the accounts of shard {shown} (its client's summary, status, rejects "
        f"and failures); this client takes shard {shard}{of}, which does not cover it, so a run would drop "
        f"the accounts of that shard's samples outside {host_shard}. Extract with --shard {clash[0]} as before, "
        f"or extract shard {host_shard} into a new output directory"
    )


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
