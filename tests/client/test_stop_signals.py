"""A systemd stop (SIGTERM) ends the client and the drain cleanly at any instant of their lives.

Each test sends the signal at a state it reads from the process itself (``/proc/<pid>/status``:
the signal caught, or ignored), its log or its status file, never after a sleep:

* during start-up, as soon as the process handles SIGTERM, while it still imports torch, and while
  the client waits for its start-up probe;
* in the middle of a run, held there by freezing the server (SIGSTOP);
* at the end, once the work is done and only the interpreter's exit is left;
* while the client waits for a server that is down.

The answer is always exit status 0 and the state ``stopped`` (or ``done`` when the work was done),
at once; a client stopped before its run began has written nothing.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hsextract.dataset.chat_template import load_tokenizer
from support.answering_server import AnsweringServer
from support.client_run import (
    assert_training_set_matches,
    client_status,
    env,
    extract_args,
    lines_unsent,
    start_client,
    start_drain,
    stop,
    tail,
    wait_exit,
    wait_for,
    write_mixed_dataset,
)
from support.drain_proc import drain_args

pytestmark = pytest.mark.slow

SIGTERM_BIT = 1 << (signal.SIGTERM - 1)
LINES = 120  # the dataset of the ten-stops test
STARTUP_LINE = "start-up: "  # the client's log line once its start-up (the probe included) is over


def _signal_mask(pid: int, field: str) -> int:
    """The process's SigCgt (caught) or SigIgn (ignored) mask; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def _libtorch_loaded(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _start(log: Path, *args: str) -> subprocess.Popen:
    fh = log.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "hsextract", *args],
        env=env(),
        stdout=fh,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _exit_code(proc: subprocess.Popen, log: Path, timeout: float = 60) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running {timeout:.0f} s after SIGTERM:\n{tail(log)}") from None


def _sigterm_when_handled(proc: subprocess.Popen) -> bool:
    """Send SIGTERM as soon as the process handles it; True if torch was not loaded yet then."""
    wait_for(
        lambda: _signal_mask(proc.pid, "SigCgt") & SIGTERM_BIT or proc.poll() is not None,
        30,
        "the process to handle SIGTERM",
        every=0.001,
    )
    early = not _libtorch_loaded(proc.pid)
    proc.send_signal(signal.SIGTERM)
    return early


def _drain_args(tmp_path: Path, *extra: str) -> list[str]:
    return drain_args(tmp_path / "dump", tmp_path / "out", "specforge", "--poll-interval", "0.1", *extra)


def _client_args(tmp_path: Path, model: Path, port: int) -> list[str]:
    data = tmp_path / "data.jsonl"
    data.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n"
    )
    return [
        "extract",
        "--server",
        f"http://127.0.0.1:{port}",
        "--dataset",
        str(data),
        "--model",
        str(model),
        "--dump-dir",
        str(tmp_path / "dump"),
        "--output",
        str(tmp_path / "out"),
        "--format",
        "specforge",
        "--log-every",
        "1",
    ]


def _drain_state(out: Path) -> str:
    try:
        return json.loads((out / ".hsextract" / "drain-status.json").read_text()).get("state", "")
    except (OSError, ValueError):
        return ""


def test_drain_stopped_during_its_imports_exits_0_as_stopped(tmp_path):
    (tmp_path / "dump").mkdir()
    log = tmp_path / "drain.log"
    proc = _start(log, *_drain_args(tmp_path))
    early = _sigterm_when_handled(proc)
    assert _exit_code(proc, log) == 0, tail(log)
    assert early, "the SIGTERM handler must be in place before the subcommand imports torch"
    assert _drain_state(tmp_path / "out") == "stopped", tail(log)


@pytest.fixture
def answering_server():
    server = AnsweringServer()
    yield server
    server.close()


def test_client_stopped_during_its_imports_exits_0_at_once_having_sent_and_written_nothing(
    tmp_path, tiny_llama, answering_server
):
    """The stop lands while the client imports torch: it is honoured as soon as the command runs,
    before the tokenizer is loaded (seconds), the dataset is read or the probe is sent (which,
    against a server that captures nothing, would wait a minute for its dump). (Measured on 2 busy
    cores: 2.8-4.1 s from SIGTERM to exit, the import of torch; before, 32-36 s and exit 2 with a 20 s
    probe timeout.)"""
    log = tmp_path / "client.log"
    args = _client_args(tmp_path, tiny_llama, 0)
    args[args.index("--server") + 1] = answering_server.url
    proc = _start(log, *args)
    early = _sigterm_when_handled(proc)
    assert _exit_code(proc, log) == 0, tail(log)
    assert early, "the SIGTERM handler must be in place before the subcommand imports torch"
    assert "stopped before its run began (asked to stop before loading the tokenizer)" in log.read_text(), tail(log)
    assert answering_server.requests == [], "nothing was sent to the server"
    assert not (tmp_path / "out").exists(), "a start stopped before its run began writes nothing"


def test_client_stopped_while_it_waits_for_its_probe_exits_0_at_once(tmp_path, tiny_llama, answering_server):
    """The server answers the probe but no dump comes (no capture): the stop ends the wait at once,
    where the probe's timeout is two minutes."""
    log = tmp_path / "client.log"
    args = _client_args(tmp_path, tiny_llama, 0)
    args[args.index("--server") + 1] = answering_server.url
    proc = _start(log, *args, "--probe-timeout", "120")
    try:
        wait_for(
            lambda: answering_server.generated.is_set() or proc.poll() is not None,
            180,
            "the client to send its probe",
            log,
        )
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert _exit_code(proc, log) == 0, tail(log)
        took = time.monotonic() - signalled
    finally:
        stop(proc)
    assert took < 30, f"exited {took:.1f} s after SIGTERM: the stop waited for the probe (120 s)"
    assert answering_server.posts() == ["/generate"], "the probe alone was sent"
    status = client_status(tmp_path / "out")
    assert status["state"] == "stopped" and status["error"] == "", status
    assert not list((tmp_path / "dump" / "_records").glob("*.json")), "no sample was recorded"
    assert not (tmp_path / "out" / ".hsextract" / "client-summary.json").exists()


def test_drain_stopped_while_it_exits_after_its_work_exits_0(tmp_path):
    """The drain finishes (--exit-when-done), and SIGTERM lands while the interpreter shuts down."""
    (tmp_path / "dump").mkdir()
    state = tmp_path / "out" / ".hsextract"
    state.mkdir(parents=True)
    (state / "client-summary.json").write_text(json.dumps({"state": "done", "dataset_lines": 0, "shard": [0, 1]}))
    log = tmp_path / "drain.log"
    proc = _start(log, *_drain_args(tmp_path, "--exit-when-done"))
    # SigIgn gets the SIGTERM bit once main() has returned: only the exit is left.
    wait_for(
        lambda: _signal_mask(proc.pid, "SigIgn") & SIGTERM_BIT or proc.poll() is not None,
        60,
        "the drain to finish its work",
        log,
        every=0.001,
    )
    proc.send_signal(signal.SIGTERM)
    assert _exit_code(proc, log) == 0, tail(log)
    assert _drain_state(tmp_path / "out") == "done"


def test_client_stopped_while_the_server_is_down_exits_0_as_stopped(tmp_path, tiny_llama, free_port):
    log = tmp_path / "client.log"
    out = tmp_path / "out"
    proc = _start(log, *_client_args(tmp_path, tiny_llama, free_port()))
    try:
        wait_for(
            lambda: "waiting for the server" in (client_status(out).get("paused_reason") or ""),
            120,
            "the client to wait for the (down) server",
            log,
        )
        proc.send_signal(signal.SIGTERM)
        assert _exit_code(proc, log) == 0, tail(log)
    finally:
        if proc.poll() is None:
            proc.kill()
    status = client_status(out)
    assert status["state"] == "stopped" and status["error"] == "", status
    text = log.read_text()
    assert "resumed sending" not in text, "a stop is not a resumption"
    failures = out / ".hsextract" / "failures.jsonl"
    assert not failures.exists() or not failures.read_text(), "a stop fails no sample"


@pytest.mark.server
def test_client_stopped_after_its_run_exits_0_as_done(tmp_path, tiny_llama, llama_server):
    """SIGTERM once the run is done and the client is exiting: exit 0, the run stays done."""
    out = tmp_path / "out"
    args = _client_args(tmp_path, tiny_llama, llama_server.port)
    args[args.index("--dump-dir") + 1] = str(llama_server.dump_dir)
    log = tmp_path / "client.log"
    proc = _start(log, *args)
    try:
        wait_for(
            lambda: _signal_mask(proc.pid, "SigIgn") & SIGTERM_BIT or proc.poll() is not None,
            120,
            "the client to finish its run",
            log,
            every=0.001,
        )
        proc.send_signal(signal.SIGTERM)
        assert _exit_code(proc, log) == 0, tail(log)
    finally:
        if proc.poll() is None:
            proc.kill()
        run_id = json.loads((out / "run.json").read_text())["run_id"]
        dump = Path(llama_server.dump_dir)  # the shared server's staging keeps only what its tests still use
        for d in dump.glob(f"*-{run_id}-*"):
            shutil.rmtree(d)
        for r in dump.glob(f"_records/*-{run_id}-*"):
            r.unlink()
    assert client_status(out)["state"] == "done", tail(log)
    assert (out / ".hsextract" / "client-summary.json").exists()


@pytest.mark.server
def test_sigterm_at_ten_random_instants_ends_each_run_cleanly_and_loses_nothing(llama_server, tiny_llama, tmp_path):
    """Ten systemd stops at random instants of ten client runs: three in a run's first second
    (from the moment the interpreter runs Python code and handles SIGTERM), four mid-run (held
    there by freezing the server), three in its last second. Each run exits 0: stopped, or done
    where a last-second stop came after the run had finished; and the run that follows completes
    the set, every sample exactly once."""
    exp = write_mixed_dataset(tmp_path / "data.jsonl", load_tokenizer(tiny_llama), n_lines=LINES, seed=9)
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    args = extract_args(
        llama_server.url,
        tmp_path / "data.jsonl",
        tiny_llama,
        llama_server.dump_dir,
        out,
        "--max-tokens",
        "300",
        "--overlong",
        "skip",
        "--max-in-flight",
        "3",
    )
    rng = random.Random(20261130)
    drain = start_drain(logs / "drain.log", llama_server.dump_dir, out, tiny_llama)
    client = None
    ends = []
    try:
        for when in ["first second"] * 3 + ["mid-run"] * 4 + ["last second"] * 3:
            startups = _startups(logs / "client.log")
            client = start_client(logs / "client.log", *args)
            if when == "first second":
                wait_for(
                    lambda c=client: _signal_mask(c.pid, "SigCgt") & SIGTERM_BIT or c.poll() is not None,
                    30,
                    "the client to handle SIGTERM",
                    every=0.001,
                )
            elif when == "mid-run":
                _hold_mid_run(llama_server, client, out, logs / "client.log", startups, rng)
            elif when == "last second":
                wait_for(
                    lambda c=client: _near_the_end(out, c.pid) or c.poll() is not None,
                    240,
                    "the client to send its last samples",
                    logs / "client.log",
                )
            if when != "mid-run":
                time.sleep(rng.uniform(0, 1))  # the random instant within the second
            try:
                client.send_signal(signal.SIGTERM)
            finally:
                llama_server.resume()  # a mid-run stop's client finishes its requests in flight
            rc = wait_exit(client, 60, logs / "client.log")
            status = client_status(out)
            # A client stopped before its run began leaves the status of the run before it as it was.
            state = status.get("state") if status.get("pid") == client.pid else "stopped before it began"
            ends.append((when, rc, state))
            assert rc == 0 and state in ("stopped", "done", "stopped before it began"), (
                f"{when}: exit {rc}, state {state}:\n" + tail(logs / "client.log")
            )
        client = start_client(logs / "client.log", *args)
        assert wait_exit(client, 420, logs / "client.log") == 0, tail(logs / "client.log")
        assert wait_exit(drain, 180, logs / "drain.log") == 0, tail(logs / "drain.log")
    finally:
        llama_server.resume()
        stop(client)
        stop(drain)
    assert all(state.startswith("stopped") for when, _, state in ends if when != "last second"), ends
    assert_training_set_matches(out, exp)
    accepted = len(exp.samples)
    assert f"{accepted} accepted = {accepted} in the set + 0 failed + 0 quarantined" in (logs / "drain.log").read_text()


def _hold_mid_run(server, client: subprocess.Popen, out: Path, log: Path, startups: int, rng: random.Random) -> None:
    """Bring `client` to a random instant of the middle of its run and leave `server` frozen there.

    The client answers a sample in tens of milliseconds here and writes its status once a second,
    so a stop timed by the status's counts can land after the last line was sent. The run goes only
    as far as the test lets it instead: a random fraction of a second from the client's log line
    that its start-up is over, then the server is frozen; a status written after that must show
    lines the client has not sent. `startups`: the log's start-up lines before this client started.
    """
    wait_for(
        lambda: _startups(log) > startups or client.poll() is not None,
        120,
        "the client to end its start-up",
        log,
        every=0.005,
    )
    time.sleep(rng.uniform(0, 0.2))  # the random instant: how far the run gets
    server.pause()
    frozen_at = time.time()
    s = wait_for(
        lambda: (st := client_status(out)).get("pid") == client.pid and st.get("updated_at", 0) > frozen_at and st,
        30,
        "a status of the client written after the server froze",
        log,
    )
    assert lines_unsent(s) > 0, f"the client has sent every line before the mid-run stop: {s}"


def _startups(log: Path) -> int:
    """How many clients have logged the end of their start-up in `log` (none before the first)."""
    return log.read_text(errors="replace").count(STARTUP_LINE) if log.exists() else 0


def _near_the_end(out: Path, pid: int) -> bool:
    s = client_status(out)
    return s.get("pid") == pid and lines_unsent(s) <= 2
