"""The drain's worker processes start in the background: the drain writes samples from its first
second, in its own threads, and hands them to the processes once they are up.

A spawned interpreter takes seconds to import torch (8 took 9-11 s on the H200 host, 25-32 s on
2 cores); a drain that waited for them let the staging area fill and the client pause meanwhile.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import ClassVar

import pytest
from hsextract.drain import core
from hsextract.drain.core import DrainConfig, Drainer
from hsextract.drain.worker_processes import WorkerProcesses
from hsextract.output.manifest import iter_entries, verify_entry
from hsextract.output.run_id import load_or_create_run_id
from support.drain_proc import finish_client
from support.staged_dumps import stage_sample

pytestmark = pytest.mark.timeout(300)


class _HeldBack(WorkerProcesses):
    """The real worker processes, whose readiness the test holds back until it releases it."""

    released: ClassVar[threading.Event] = threading.Event()
    made: ClassVar[list[_HeldBack]] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.made.append(self)

    def ready(self) -> bool:
        return self.released.is_set() and super().ready()


def test_the_drain_writes_every_sample_in_its_threads_while_its_worker_processes_start(tmp_path, monkeypatch):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    for i in range(20):
        stage_sample(dump, run, i, tokens=50)
    finish_client(out, 20)
    monkeypatch.setattr(core, "WorkerProcesses", _HeldBack)
    cfg = DrainConfig(
        dump_dir=dump,
        output=out,
        format="speculators",
        workers=2,
        worker_mode="processes",
        poll_interval_s=0.05,
        status_interval_s=0.2,
        exit_when_done=True,
    )

    Drainer(cfg).run()  # the processes never become ready: the drain's threads write every sample

    entries = list(iter_entries(out))
    assert sorted(e.dataset_index for e in entries) == list(range(20))
    assert all(verify_entry(out, e) is None for e in entries)
    assert [p.n for p in _HeldBack.made] == [2], "the drain did not start its worker processes"
    assert not _HeldBack.released.is_set()


def test_worker_processes_are_started_without_waiting_and_say_when_they_are_up(tmp_path: Path, caplog):
    caplog.set_level(logging.INFO, logger="hsextract.drain")
    procs = WorkerProcesses(2, "speculators", tmp_path)
    try:
        # Two fresh interpreters importing torch cannot be up the instant the constructor returns.
        assert not procs.ready()
        assert len(procs.pids) == 2, "both processes are spawned at once"
        assert procs.wait_ready(timeout=240)
        assert procs.ready()
    finally:
        procs.close()
    assert any("2 worker processes started in" in r.getMessage() for r in caplog.records), caplog.text
