"""One process writes an output directory's training set at a time: the drain holds the output's
lock, a second drain and ``hsextract finalize`` refuse while it runs, naming it, and a drain
killed with SIGKILL leaves the lock to the next one at once (the real commands, as processes).

Two drains on one output once wrote a manifest of 31 rows for 30 samples, one sample file over
another, and both said the run was fine.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from hsextract.output.lock import OutputLock
from hsextract.output.manifest import iter_entries, verify_entry
from hsextract.output.run_id import load_or_create_run_id
from support.client_run import stop, wait_for
from support.drain_proc import finish_client, hsextract, start
from support.staged_dumps import stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _drain_args(dump: Path, out: Path, *extra: str) -> list[str]:
    return [
        "drain",
        "--dump-dir",
        str(dump),
        "--output",
        str(out),
        "--format",
        "speculators",
        "--workers",
        "1",
        "--poll-interval",
        "0.1",
        "--finalize-idle",
        "3600",
        *extra,
    ]


def _start_drain(dump: Path, out: Path, log: Path, *extra: str) -> subprocess.Popen:
    return start(
        *_drain_args(dump, out, *extra), stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True
    )


def _holder_pid(out: Path) -> int | None:
    try:
        return json.loads((out / ".hsextract" / "output.lock").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def _drain_state(out: Path) -> str:
    try:
        return json.loads((out / ".hsextract" / "drain-status.json").read_text()).get("state", "")
    except (OSError, ValueError):
        return ""


def _refusal(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, f"a refusal is one line, got:\n{r.stderr}"
    return lines[0]


def test_two_drains_started_at_once_on_one_output_write_each_sample_once(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    for i in range(30):
        stage_sample(dump, run, i, tokens=40)
    finish_client(out, 30)
    procs = [
        start(*_drain_args(dump, out, "--exit-when-done"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    try:
        results = sorted((p.wait(240), p.stderr.read()) for p in procs)
    finally:
        for p in procs:
            stop(p)
    (ok, _), (busy, err) = results
    assert (ok, busy) == (0, 75), results
    assert "is in use by hsextract drain (pid " in err and f"on {socket.gethostname()}" in err, err
    entries = list(iter_entries(out))
    assert [e.output_index for e in entries] == list(range(30))
    assert sorted(e.dataset_index for e in entries) == list(range(30)), "every sample once"
    assert all(verify_entry(out, e) is None for e in entries)


def test_a_second_drain_refuses_in_one_line_naming_the_running_drain(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    dump.mkdir()
    first = _start_drain(dump, out, tmp_path / "first.log")
    try:
        wait_for(
            lambda: _holder_pid(out) == first.pid and _drain_state(out) == "running",
            120,
            "the first drain to hold the output",
            tmp_path / "first.log",
        )
        r = hsextract(*_drain_args(dump, out), timeout=120)
        assert r.returncode == 75, r.stderr
        line = _refusal(r)
        assert (
            f"the output directory {out} is in use by hsextract drain (pid {first.pid} on "
            f"{socket.gethostname()}, since " in line
        ), line
        assert "another --output" in line, "it says what to do"
        assert first.poll() is None and _holder_pid(out) == first.pid, "the running drain is untouched"
    finally:
        stop(first, signal.SIGTERM)


def test_a_drain_killed_with_sigkill_leaves_the_output_to_the_next_drain_at_once(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    for i in range(5):
        stage_sample(dump, run, i)
    killed = _start_drain(dump, out, tmp_path / "killed.log")
    try:
        wait_for(
            lambda: _holder_pid(out) == killed.pid, 120, "the first drain to hold the output", tmp_path / "killed.log"
        )
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
    finally:
        stop(killed)
    finish_client(out, 5)
    r = hsextract(*_drain_args(dump, out, "--exit-when-done"), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(e.dataset_index for e in iter_entries(out)) == list(range(5))


def test_finalize_and_its_verification_refuse_while_a_drain_holds_the_output(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    stage_sample(dump, run, 0)
    drain = _start_drain(dump, out, tmp_path / "drain.log")
    try:
        wait_for(
            lambda: len(list(iter_entries(out))) == 1 and _holder_pid(out) == drain.pid,
            120,
            "the drain to write the sample",
            tmp_path / "drain.log",
        )
        for extra in ([], ["--verify"]):
            r = hsextract("finalize", "--output", str(out), *extra, timeout=120)
            assert r.returncode == 75, r.stdout + r.stderr
            assert f"is in use by hsextract drain (pid {drain.pid} on" in _refusal(r)
            assert not r.stdout, "nothing was verified or written"
    finally:
        stop(drain, signal.SIGTERM)
    r = hsextract("finalize", "--output", str(out), "--verify", timeout=120)
    assert r.returncode == 0 and "verified 1/1 samples" in r.stdout, r.stdout + r.stderr


def test_a_drain_refuses_while_finalize_holds_the_output(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    dump.mkdir()
    with OutputLock(out, "finalize"):
        r = hsextract(*_drain_args(dump, out), timeout=120)
    assert r.returncode == 75, r.stderr
    assert "is in use by hsextract finalize (pid " in _refusal(r)
