"""`hsextract fleet plan|status` as a command: the hosts' reports from stdin, its exit status, its JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.fleet_reports import report, status

pytestmark = pytest.mark.slow


def test_the_command_reads_the_hosts_from_stdin_and_exits_5_when_a_host_has_no_room(tmp_path):
    data = {
        "group": "gpu",
        "hosts": {
            "a": {"shard": "0/2", "report": report("0/2"), "rc": 0},
            "b": {"shard": "1/2", "report": report("1/2", ok=False), "rc": 5, "error": "no room"},
        },
    }
    r = subprocess.run(
        [sys.executable, "-m", "hsextract", "fleet", "plan", "-", "--write", str(tmp_path / "p.json")],
        input=json.dumps(data),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 5, r.stderr
    assert "  PROBLEM host b cannot hold its shard 1/2: no room" in r.stdout.splitlines()
    written = json.loads((tmp_path / "p.json").read_text())
    assert written["ok"] is False and written["totals"]["samples"] == 20


def test_the_command_prints_json_and_exits_3_when_a_host_is_not_ok():
    data = {"group": "gpu", "hosts": {"a": {"status": status()}, "b": {"status": None, "error": "unreachable"}}}
    r = subprocess.run(
        [sys.executable, "-m", "hsextract", "fleet", "status", "--json"],
        input=json.dumps(data),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 3, r.stderr
    out = json.loads(r.stdout)
    assert out["hosts"]["b"]["state"] == "unreachable" and out["hosts"]["a"]["in_set"] == 8 and not out["ok"]
