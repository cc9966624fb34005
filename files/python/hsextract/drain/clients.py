"""What the drain knows of the output's clients: have they all finished, and on which samples did
they give up.

``--exit-when-done`` ends the drain once the run's clients have all finished and staging holds
no dump of the run. A finished client run leaves its summary; a drain that finished on some
summaries records them in its status file (``finished_client_runs``), so that the next drain of
the output, started before a rerun's client, does not take the old summaries for the end of the
new run. Once the clients have finished, the samples they gave up on (their failures files) will
get no done marker: their half-written dumps are quarantined after a short grace (see triage).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path

from hsextract.output.client_files import read_shards, run_finished, summary_ids
from hsextract.output.layout import FAILURES, client_files
from hsextract.output.lock import running_clients
from hsextract.output.run_files import read_drain_status

log = logging.getLogger("hsextract.drain")

# The scan asks whether the clients have finished for every unfinished dump: the answer is
# computed again at most this often.
ASK_EVERY_S = 0.2


class ClientRuns:
    """The clients of one output, as the drain's main thread and scan see them."""

    def __init__(self, out: Path, exit_when_done: bool):
        self.out = out
        self._exit_when_done = exit_when_done
        # The client summaries a drain of this output finished a run on (its status file; read at start).
        self.consumed: set[str] = set()
        self._finished = False
        self._asked_at = -1.0
        self._told_rerun = False
        self._abandoned: set[str] = set()
        self._abandoned_key: tuple | None = None

    def recover(self) -> None:
        """Read which client runs the last drain of the output finished on."""
        self.consumed = finished_client_runs(self.out)

    def summaries(self) -> list[str]:
        """The client summaries in the output now (what a drain that finishes records)."""
        return summary_ids(read_shards(self.out))

    def finished(self) -> bool:
        """Whether the run's clients have all finished: every shard's summary is there, no client
        runs, and the summaries are not those of the run a drain of this output finished already
        (a drain started before a rerun's client would else finalize and exit at once)."""
        now = time.monotonic()
        if now - self._asked_at >= ASK_EVERY_S:
            shards = read_shards(self.out)
            finished = run_finished(shards, len(running_clients(self.out)), self.consumed)
            if (
                not finished
                and self._exit_when_done
                and self.consumed
                and set(summary_ids(shards)) == self.consumed
                and not self._told_rerun
            ):
                self._told_rerun = True
                log.info(
                    "the client summary in %s is of the run a drain of this output finished already; "
                    "waiting for the next client run to finish (--exit-when-done)",
                    self.out,
                )
            self._finished, self._asked_at = finished, now
        return self._finished

    def abandoned_rids(self) -> set[str]:
        """Rids the clients gave up on (their failures files), once they have finished; else empty."""
        if not self.finished():
            return set()
        paths = list(client_files(self.out, FAILURES).values())
        key = tuple(_file_key(p) for p in paths)
        if key != self._abandoned_key:
            rids: set[str] = set()
            for path in paths:
                rids |= _failed_rids(path)
            self._abandoned, self._abandoned_key = rids, key
        return self._abandoned


def finished_client_runs(out: Path) -> set[str]:
    """The client summaries the last drain of `out` finished a run on (from its status file)."""
    status = read_drain_status(out)
    return {str(s) for s in (status.finished_client_runs if status else None) or []}


def _file_key(path: Path) -> tuple[str, int, int]:
    try:
        st = path.stat()
    except FileNotFoundError:
        return (path.name, -1, -1)
    return (path.name, st.st_size, st.st_mtime_ns)


def _failed_rids(path: Path) -> set[str]:
    """The rids of a client's failures file (a torn or foreign line is skipped)."""
    rids = set()
    with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                rid = json.loads(line).get("rid")
                if isinstance(rid, str):
                    rids.add(rid)
    return rids
