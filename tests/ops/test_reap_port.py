"""`hsextract reap-port` stops the listeners that match, and only them.

The real-process tests start their own listeners on free ports, with a unique marker in their command
line as the pattern, so no process of anyone else can ever match.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from hsextract.ops.reap_port import Holder, plan_reap

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "files" / "python")}

LISTENER = """
import signal, socket, sys, time
if sys.argv[2] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("ready", flush=True)
time.sleep(600)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def spawn():
    """Start helper processes; kill every one at the end, also on failure."""
    procs: list[subprocess.Popen] = []

    def _spawn(*argv: str, listen: bool = True) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        if listen:
            assert p.stdout.readline().strip() == "ready"
        return p

    yield _spawn
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def reap(port: int, match: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hsextract", "reap-port", "--port", str(port), "--match", match, *extra],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )


def exited(p: subprocess.Popen, timeout: float = 5) -> bool:
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


# ---- the plan (pure) ----------------------------------------------------------------------------


def test_a_matching_listener_is_a_target_once_even_with_two_sockets():
    holders = [
        Holder(42, "python -m sglang.launch_server", "0.0.0.0:30000"),
        Holder(42, "python -m sglang.launch_server", ":::30000"),
    ]
    plan = plan_reap(holders, re.compile("sglang"), protected={1})
    assert [t.pid for t in plan.targets] == [42]
    assert plan.refusals == ()


def test_a_non_matching_holder_is_refused_and_named():
    plan = plan_reap([Holder(7, "nginx: master", "0.0.0.0:30000")], re.compile("sglang"), protected={1})
    assert plan.targets == ()
    assert plan.refusals[0].holder.pid == 7
    assert "does not match" in plan.refusals[0].reason


def test_pid_1_and_the_callers_own_chain_are_never_targets_even_when_they_match():
    holders = [Holder(1, "sglang as init", "0.0.0.0:30000"), Holder(99, "sglang parent", "0.0.0.0:30000")]
    plan = plan_reap(holders, re.compile("sglang"), protected={1, 99})
    assert plan.targets == ()
    assert [r.holder.pid for r in plan.refusals] == [1, 99]


def test_a_socket_whose_owner_is_invisible_is_refused():
    plan = plan_reap([Holder(None, "", "0.0.0.0:30000")], re.compile(".*"), protected={1})
    assert plan.targets == () and "not visible" in plan.refusals[0].reason


# ---- real processes -----------------------------------------------------------------------------


def test_a_matching_listener_is_stopped_with_sigterm_and_the_port_is_free(spawn):
    port, marker = free_port(), f"hsx-old-server-{uuid.uuid4().hex}"
    server = spawn("-c", LISTENER, str(port), "plain", marker)
    result = reap(port, marker)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["changed"] is True and report["port_free"] is True
    assert [(s["pid"], s["signal"]) for s in report["stopped"]] == [(server.pid, "SIGTERM")]
    assert marker in report["stopped"][0]["cmdline"]
    assert exited(server) and server.returncode == -signal.SIGTERM


def test_a_listener_that_ignores_sigterm_gets_sigkill(spawn):
    port, marker = free_port(), f"hsx-stuck-{uuid.uuid4().hex}"
    server = spawn("-c", LISTENER, str(port), "ignore-term", marker)
    result = reap(port, marker, "--term-timeout", "0.5")
    assert result.returncode == 0, result.stderr
    assert [s["signal"] for s in json.loads(result.stdout)["stopped"]] == ["SIGKILL"]
    assert exited(server) and server.returncode == -signal.SIGKILL


def test_a_non_matching_holder_fails_with_its_pid_and_command_line_and_survives(spawn):
    port = free_port()
    other = spawn("-c", LISTENER, str(port), "plain", "unrelated-service")
    result = reap(port, f"hsx-{uuid.uuid4().hex}")
    assert result.returncode == 3
    assert f"pid {other.pid}" in result.stderr and "unrelated-service" in result.stderr
    assert other.poll() is None


def test_a_matching_process_that_does_not_listen_on_the_port_is_untouched(spawn):
    port, marker = free_port(), f"hsx-bystander-{uuid.uuid4().hex}"
    bystander = spawn("-c", "import time; time.sleep(600)", marker, listen=False)
    elsewhere = spawn("-c", LISTENER, str(free_port()), "plain", marker)
    result = reap(port, marker)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "port": port,
        "pattern": marker,
        "dry_run": False,
        "changed": False,
        "stopped": [],
        "port_free": True,
    }
    time.sleep(0.2)
    assert bystander.poll() is None and elsewhere.poll() is None


def test_dry_run_reports_the_target_and_signals_nothing(spawn):
    port, marker = free_port(), f"hsx-dry-{uuid.uuid4().hex}"
    server = spawn("-c", LISTENER, str(port), "plain", marker)
    result = reap(port, marker, "--dry-run")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["changed"] is True and [t["pid"] for t in report["would_stop"]] == [server.pid]
    assert psutil.Process(server.pid).is_running() and server.poll() is None


def test_an_invalid_pattern_is_a_config_error_naming_the_flag():
    result = reap(free_port(), "sglang(")
    assert result.returncode == 2 and "--match" in result.stderr


def test_a_kept_listener_is_left_running_and_reported_as_kept(spawn):
    port, marker = free_port(), f"hsx-current-{uuid.uuid4().hex}"
    server = spawn("-c", LISTENER, str(port), "plain", marker)
    result = reap(port, marker, "--keep-pid", str(server.pid))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["changed"] is False and report["stopped"] == [] and report["port_free"] is False
    assert [k["pid"] for k in report["kept"]] == [server.pid]
    assert server.poll() is None
