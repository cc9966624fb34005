"""``drain --exit-when-done`` exits when the run's clients have finished, and not before: not on the
summary of the run before (a drain started ahead of a rerun's client once finalized and exited at
once, leaving the rerun undrained), and not while a client of the output runs.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
from hsextract.drain.core import DrainConfig, Drainer
from hsextract.output.lock import ShardLock, running_clients
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from hsextract.shard import Shard
from support.client_run import stop, tail, wait_for
from support.drain_proc import drain_until_done, finish_client, start
from support.staged_dumps import stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _in_set(out: Path) -> list[int]:
    return sorted(e.dataset_index for e in iter_entries(out))


def test_a_drain_started_before_a_rerun_client_waits_for_it_instead_of_taking_the_last_summary(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    for i in range(3):
        stage_sample(dump, run, i)
    drain_until_done(dump, out, "speculators", lines=3)  # the first run: done, drained, finalized
    log = tmp_path / "drain.log"
    drain = start(
        "drain",
        "--dump-dir",
        str(dump),
        "--output",
        str(out),
        "--format",
        "speculators",
        "--exit-when-done",
        "--poll-interval",
        "0.1",
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: "waiting for the next client run to finish" in log.read_text() or drain.poll() is not None,
            120,
            "the drain to see that the summary is the last run's",
            log,
        )
        assert drain.poll() is None, f"exited on the last run's summary:\n{tail(log)}"
        for i in (3, 4):  # the rerun: the dataset grew by two samples, its client stages them, then finishes
            stage_sample(dump, run, i)
        finish_client(out, 5)
        assert drain.wait(120) == 0, tail(log)
    finally:
        stop(drain)
    assert _in_set(out) == [0, 1, 2, 3, 4]
    assert "5 accepted = 5 in the set + 0 failed + 0 quarantined" in log.read_text(), tail(log)


def test_exit_when_done_waits_while_a_client_of_the_output_runs(tmp_path, monkeypatch):
    dump, out = tmp_path / "dump", tmp_path / "out"
    stage_sample(dump, load_or_create_run_id(out), 0)
    finish_client(out, 1)  # a summary is there, but a client is at its start (it keeps the summary till then)
    client = ShardLock(out, Shard(0, 1)).acquire()
    looked = threading.Semaphore(0)

    def counted(output):  # each time the drain looks for running clients
        found = running_clients(output)
        looked.release()
        return found

    monkeypatch.setattr("hsextract.drain.clients.running_clients", counted)
    d = Drainer(
        DrainConfig(
            dump_dir=dump, output=out, format="speculators", workers=1, poll_interval_s=0.05, exit_when_done=True
        )
    )
    t = threading.Thread(target=d.run)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while _in_set(out) != [0]:
            assert time.monotonic() < deadline, "the staged sample was never written"
            time.sleep(0.05)
        while looked.acquire(blocking=False):
            pass
        for _ in range(3):  # with its sample written, the drain found the client running three more times
            assert looked.acquire(timeout=60), "the drain never looked for running clients"
        assert t.is_alive(), "exited while a client of the output ran"
        client.release()
        t.join(30)
        assert not t.is_alive()
    finally:
        client.release()
        d.stop_event.set()
        t.join(10)
