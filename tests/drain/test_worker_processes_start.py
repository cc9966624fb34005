"""The drain's worker processes start in the background: the drain writes samples from its first
second, in its own threads, and hands them to the processes once they are up.

Eight spawned interpreters, each importing torch, took 9-11 s on the H200 host (25-32 s on 2 cores);
a drain that waited for them let the staging area fill and the client pause meanwhile. They are now
forks of one server that imported torch once, still started in the background.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

import psutil
import pytest
from hsextract.drain import core, worker_processes
from hsextract.drain import validate as v
from hsextract.drain.core import DrainConfig, Drainer
from hsextract.drain.prepare import Job, Ready
from hsextract.drain.worker_processes import WorkerProcesses
from hsextract.output.manifest import default_checksum_algorithm, iter_entries, verify_entry
from hsextract.output.run_id import load_or_create_run_id
from hsextract.staging.records import SampleRecord
from support.client_run import wait_for
from support.drain_proc import drain_args, env, finish_client, start
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
        # Processes that import, fork and prepare a warm-up sample cannot be up the instant the constructor returns.
        assert not procs.ready()
        assert procs.wait_ready(timeout=240)
        assert procs.ready()
        assert len(procs.pids) == 2
    finally:
        procs.close()
    assert any("2 worker processes started in" in r.getMessage() for r in caplog.records), caplog.text


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _status(pid: int) -> dict[str, str]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except FileNotFoundError:
        return {"State": "X (gone)"}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _sigterm_settled(pid: int) -> bool:
    """The process is gone, or holds no pending SIGTERM: it has acted on it (or ignored it at once)."""
    st = _status(pid)
    bit = 1 << (signal.SIGTERM - 1)
    return st["State"][0] in "ZX" or not (int(st["SigPnd"], 16) | int(st["ShdPnd"], 16)) & bit


def _alive(pid: int) -> bool:
    return _status(pid)["State"][0] not in "ZX"


def test_worker_processes_are_forks_of_one_server_and_both_outlive_a_stops_sigterm(tmp_path: Path):
    """systemd's stop sends SIGTERM to every process of the unit: the server the workers were forked
    from and the workers must survive it, so that the drain finishes the samples in hand through them."""
    run = "r" * 12
    staged = stage_sample(tmp_path / "dump", run, 0, tokens=40)
    record = SampleRecord(
        rid=staged.rid, index=0, input_ids=staged.input_ids.tolist(), loss_mask=staged.loss_mask.tolist(), run_id=run
    )
    job = Job(
        tmp_path / "dump" / staged.rid, record, v.Expected(final_hidden="pre_norm"), default_checksum_algorithm(), False
    )
    procs = WorkerProcesses(2, "speculators", tmp_path)
    try:
        assert procs.wait_ready(timeout=240)
        servers = {_parent(pid) for pid in procs.pids}
        assert len(servers) == 1 and servers != {os.getpid()}, "the workers are not forks of one server"
        everyone = [*servers, *procs.pids]
        for pid in everyone:
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: all(_sigterm_settled(pid) for pid in everyone), 30, "the SIGTERM to be acted on")

        assert all(_alive(pid) for pid in everyone), {pid: _status(pid)["State"] for pid in everyone}
        outcome = procs.prepare(job)
        assert isinstance(outcome, Ready), outcome
        assert outcome.prepared.tmp.stat().st_size > staged.hidden.numel() * 2
    finally:
        procs.close()


class _SlowStart(worker_processes.ProcessPoolExecutor):
    """The real pool, whose first worker waits (as for the forkserver's imports) until the test releases it."""

    gate: ClassVar[threading.Event] = threading.Event()
    pids: ClassVar[set[int]] = set()

    def submit(self, fn, /, *args, **kwargs):
        self.gate.wait()
        future = super().submit(fn, *args, **kwargs)
        self.pids.update(self._processes or {})  # started by the submit (or earlier)
        return future


def test_a_drain_done_before_its_worker_processes_are_up_does_not_wait_for_them(tmp_path: Path, monkeypatch):
    """A run shorter than the processes' start (a smoke test, a small shard) ends when its samples
    are written; the processes started afterwards are ended, never given a sample."""
    monkeypatch.setattr(worker_processes, "ProcessPoolExecutor", _SlowStart)
    procs = WorkerProcesses(2, "speculators", tmp_path)
    closing = threading.Thread(target=procs.close, daemon=True)
    try:
        closing.start()
        closing.join(60)
    finally:
        _SlowStart.gate.set()  # whatever happened, nothing stays blocked on it

    assert not closing.is_alive(), "close() waited for processes that were still starting"
    procs.wait_ready(timeout=240)  # the launcher is done: it has started the processes and ended them
    assert len(_SlowStart.pids) == 2
    wait_for(lambda: not any(_alive(pid) for pid in _SlowStart.pids), 240, "the late processes to be ended")
    assert not procs.ready() and procs.pids == []


# A drain whose run ends while its pool is still starting processes: two start, the third is asked
# for only once the interpreter's exit has begun (as when the drain's main thread returns then).
_EXIT_MID_START = """
import sys, tempfile, time
from concurrent.futures import process
from hsextract.drain import forkserver, worker_processes

class UntilExit(process.ProcessPoolExecutor):
    asked = 0
    def submit(self, fn, /, *args, **kwargs):
        if UntilExit.asked == 2:
            while not process._global_shutdown:
                time.sleep(0.01)
        UntilExit.asked += 1
        return super().submit(fn, *args, **kwargs)

worker_processes.ProcessPoolExecutor = UntilExit
forkserver.start()
procs = worker_processes.WorkerProcesses(4, "speculators", tempfile.mkdtemp())
while UntilExit.asked < 2:
    time.sleep(0.01)
procs.close()
print("the drain's run is over", file=sys.stderr, flush=True)
"""


@pytest.mark.slow
def test_a_drain_whose_run_ends_while_its_worker_processes_start_exits_without_waiting_for_them():
    """The processes started wait for the others at a barrier (10 minutes at most) and the exiting
    drain waited for them: a 600-second hang after a run shorter than the processes' start."""
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_MID_START], env=env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "the drain's run is over" in done.stderr, done.stderr[-3000:]


@pytest.mark.slow
def test_a_drain_killed_with_sigkill_leaves_no_worker_process_behind(tmp_path: Path):
    """Its workers ignore SIGTERM and its forkserver lives while they do: left running, they held
    memory and made systemd's restart wait for its stop timeout to SIGKILL them."""
    (tmp_path / "dump").mkdir()
    proc = start(
        *drain_args(tmp_path / "dump", tmp_path / "out", "speculators", "--workers", "2", "--worker-mode", "processes"),
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    left: list[int] = []
    try:
        for line in proc.stderr:
            if "worker processes started" in line:
                break
        left = [child.pid for child in psutil.Process(proc.pid).children(recursive=True)]
        assert len(left) >= 3, left  # the forkserver and its two workers (and the resource tracker)

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)

        wait_for(lambda: not any(_alive(pid) for pid in left), 60, "the drain's processes to end")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# `python -m hsextract drain`, with a note of what the drain had imported each time it spawned its
# forkserver (`start` is called again by the pool, which finds the server running).
_NOTING_START = """
import runpy, sys
from multiprocessing import forkserver as mp_forkserver
from hsextract.drain import forkserver
real = forkserver.start
def noting_start():
    if mp_forkserver._forkserver._forkserver_pid is None:
        print("forkserver started with torch imported:", "torch" in sys.modules, file=sys.stderr, flush=True)
    return real()
forkserver.start = noting_start
sys.argv[0] = "hsextract"
runpy.run_module("hsextract", run_name="__main__")
"""


@pytest.mark.slow
def test_the_drain_starts_its_forkserver_before_it_imports_torch(tmp_path: Path):
    """The server's imports then run beside the drain's own, not after them: 8 workers were up
    2.7-2.9 s after the drain's start on 2 cores when the pool started the server, once the drain
    had imported everything."""
    done, out = _drain_three_samples_noting(tmp_path, _NOTING_START)

    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("forkserver started with torch imported:") == 1, done.stderr[-3000:]
    assert "forkserver started with torch imported: False" in done.stderr
    assert sorted(e.dataset_index for e in iter_entries(out)) == [0, 1, 2]


# `python -m hsextract drain`, with a note of whether the Arrow library was imported when the drain
# took its first sample.
_NOTING_FIRST_SAMPLE = """
import runpy, sys
from hsextract.drain import scan
real = scan.Scanner._submit
def noting_submit(self, *args):
    if not self._took_one:
        print("first sample taken with datasets imported:", "datasets" in sys.modules, file=sys.stderr, flush=True)
    return real(self, *args)
scan.Scanner._submit = noting_submit
sys.argv[0] = "hsextract"
runpy.run_module("hsextract", run_name="__main__")
"""


@pytest.mark.slow
def test_a_drain_with_worker_processes_takes_its_first_sample_before_importing_the_arrow_library(tmp_path: Path):
    """Importing `datasets` (for the speculators Arrow dataset, built at finalize) took a second at
    start, before the first sample; with worker processes it is imported once they are up."""
    done, out = _drain_three_samples_noting(tmp_path, _NOTING_FIRST_SAMPLE)

    assert done.returncode == 0, done.stderr[-3000:]
    assert "first sample taken with datasets imported: False" in done.stderr, done.stderr[-3000:]
    assert list(out.glob("data-*.arrow")), "the Arrow dataset was built at the end"


def _drain_three_samples_noting(tmp_path: Path, script: str) -> tuple[subprocess.CompletedProcess, Path]:
    """`script` (a wrapper of ``python -m hsextract drain`` that notes something on stderr) run on three
    staged samples of a finished client, with two worker processes; its result and the output."""
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    for i in range(3):
        stage_sample(dump, run, i, tokens=50)
    finish_client(out, 3)
    args = drain_args(dump, out, "speculators", "--workers", "2", "--worker-mode", "processes", "--exit-when-done")
    done = subprocess.run([sys.executable, "-c", script, *args], env=env(), capture_output=True, text=True, timeout=240)
    return done, out
