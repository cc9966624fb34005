"""A capture's announcement in ``_captures/`` names its process by pid and start time, is removed
when the process exits where it gets to, and otherwise by whoever reads it after the process died.

Every capture start once left ``_captures/<host>-<pid>.json`` behind for good, and a later process
that got the same pid made that stale announcement look live again.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest
from hsextract.staging.announcements import (
    CaptureAnnouncement,
    live_announcements,
    process_start_ticks,
    write_announcement,
)
from support.client_run import env

pytestmark = pytest.mark.slow


def _announcement(dump, pid: int, proc_start: int) -> CaptureAnnouncement:
    return CaptureAnnouncement(
        dump_dir=str(dump),
        rid_prefix="hsx",
        final_hidden="post_norm",
        host=socket.gethostname(),
        pid=pid,
        port=30000,
        proc_start=proc_start,
    )


def test_a_running_process_announcement_is_live(tmp_path):
    path = write_announcement(tmp_path, _announcement(tmp_path, os.getpid(), process_start_ticks(os.getpid())))
    assert [a.pid for a in live_announcements(tmp_path)] == [os.getpid()]
    assert path.exists()


def test_an_announcement_whose_pid_now_belongs_to_another_process_is_stale_and_removed(tmp_path):
    started = process_start_ticks(os.getpid())
    assert started, "/proc/<pid>/stat gives the start time"
    path = write_announcement(tmp_path, _announcement(tmp_path, os.getpid(), started - 1))  # an earlier holder
    assert live_announcements(tmp_path) == []
    assert not path.exists()


def test_an_announcement_of_a_process_that_is_gone_is_removed_by_its_reader(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_start_ticks(gone.pid)
    gone.wait()
    path = write_announcement(tmp_path, _announcement(tmp_path, gone.pid, started or 1))
    assert live_announcements(tmp_path) == []
    assert not path.exists()


_CAPTURE_PROCESS = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from hsextract.capture.config import CaptureConfig
    from hsextract.capture.core import CaptureSettings
    from hsextract.capture.preflight import ServerFacts
    from hsextract.capture.sglang_hook import _announce
    from hsextract.layers import resolve

    dump = Path(sys.argv[1])
    cfg = CaptureConfig(architecture="LlamaForCausalLM", model_path="m", dump_dir=str(dump))
    settings = CaptureSettings(rid_prefix="hsx", layers=resolve(None, 8, "eagle"), hidden_size=64)
    _announce(cfg, settings, ServerFacts(device="cpu", port=30000))
    path, = (dump / "_captures").glob("*.json")
    child = os.fork()
    if child == 0:
        sys.exit(0)  # runs the exit handlers it inherited: the announcement is its parent's
    os.waitpid(child, 0)
    print("there after the fork's exit:", path.exists(), flush=True)
""")


def test_a_capture_process_that_exits_removes_its_announcement_and_its_forks_leave_it(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", _CAPTURE_PROCESS, str(tmp_path)], env=env(), capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "there after the fork's exit: True" in r.stdout, r.stdout + r.stderr[-3000:]
    assert list((tmp_path / "_captures").glob("*.json")) == [], "removed at the capture process's exit"
