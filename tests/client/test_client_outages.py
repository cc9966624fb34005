"""The client under trouble, with its own SGLang server dumping into a tiny tmpfs (40 MB).

* the staging filesystem runs short: the client pauses (and says so) instead of failing or
  filling it, and completes once the drain frees space;
* the server is killed mid-run: the client waits for /health and completes after a restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from hsextract.dataset.chat_template import load_tokenizer
from support.client_run import (
    assert_training_set_matches,
    client_status,
    extract_args,
    start_client,
    start_drain,
    stop,
    tail,
    wait_exit,
    wait_for,
    write_mixed_dataset,
)
from support.sglang_server import ServerHandle, start_server

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def small_shm(tmp_path_factory) -> Path:
    """A 40 MB tmpfs of this module's own, unmounted at the end (also on failure)."""
    d = tmp_path_factory.mktemp("small-shm")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    yield d
    if subprocess.run(["umount", str(d)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


class OwnServer:
    """A capture-enabled server this module may kill and start again on the same port and dump dir."""

    def __init__(self, model: Path, port: int, dump: Path, logs: Path):
        self.model, self.port, self.dump, self.logs = model, port, dump, logs
        self.handle: ServerHandle | None = None

    def start(self) -> None:
        self.handle = start_server(self.model, port=self.port, dump_dir=self.dump, log_dir=self.logs)

    def kill(self) -> None:
        """kill -9 of the whole server (the scheduler and detokenizer too), as a crash would."""
        assert self.handle is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.handle.proc.pid, signal.SIGKILL)
        self.handle.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def own_server(small_shm, tiny_llama, free_port, tmp_path_factory):
    srv = OwnServer(tiny_llama, free_port(), small_shm / "dump", tmp_path_factory.mktemp("own-server-logs"))
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_nearly_full_dump_filesystem_pauses_the_client_and_the_run_completes(own_server, tiny_llama, tmp_path):
    exp = write_mixed_dataset(
        tmp_path / "data.jsonl", load_tokenizer(tiny_llama), n_lines=60, seed=2, max_words=25, bad=False
    )
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    own_server.dump.mkdir(exist_ok=True)
    floor = _free(own_server.dump) - (3 << 20)  # leave the client 3 MB: half of what the dumps need
    client = start_client(
        logs / "client.log",
        *extract_args(
            own_server.url,
            tmp_path / "data.jsonl",
            tiny_llama,
            own_server.dump,
            out,
            "--shm-min-free",
            str(floor),
            "--max-in-flight",
            "4",
        ),
    )
    drain = None
    try:
        status = wait_for(
            lambda: (s := client_status(out)).get("state") == "paused" and s.get("ok", 0) > 0 and s,
            300,
            "the client to pause on the watermark",
            logs / "client.log",
        )
        assert "watermark" in status["paused_reason"] and str(own_server.dump) in status["paused_reason"]
        held = wait_for(
            lambda: (s := client_status(out)).get("in_flight") == 0 and s,
            120,
            "the requests in flight to be answered",
            logs / "client.log",
        )
        # Paused for 3 s by the client's own account: its watermark loop has looked again six times.
        again = wait_for(
            lambda: (s := client_status(out)).get("paused_s", 0) >= 3 and s,
            60,
            "the client to have been paused for 3 s",
            logs / "client.log",
        )
        assert client.poll() is None, "the client must wait, not exit"
        assert again["state"] == "paused" and again["failed"] == 0
        assert again["sent"] == held["sent"] < len(exp.samples), "nothing is sent while paused"
        assert _free(own_server.dump) >= floor - (1 << 20), "the client let staging run past the watermark"

        drain = start_drain(logs / "drain.log", own_server.dump, out, tiny_llama)
        assert wait_exit(client, 420, logs / "client.log") == 0, tail(logs / "client.log")
        assert wait_exit(drain, 180, logs / "drain.log") == 0, tail(logs / "drain.log")
    finally:
        stop(client)
        stop(drain)

    assert_training_set_matches(out, exp)
    summary = json.loads((out / ".hsextract" / "client-summary.json").read_text())
    assert summary["ok"] == len(exp.samples) and summary["paused_s"] >= 3 and summary["failed"] == {}


def test_server_killed_mid_batch_the_client_waits_and_every_sample_is_accounted_for(own_server, tiny_llama, tmp_path):
    exp = write_mixed_dataset(tmp_path / "data.jsonl", load_tokenizer(tiny_llama), n_lines=40, seed=3, bad=False)
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    drain = start_drain(logs / "drain.log", own_server.dump, out, tiny_llama)
    client = start_client(
        logs / "client.log",
        *extract_args(
            own_server.url,
            tmp_path / "data.jsonl",
            tiny_llama,
            own_server.dump,
            out,
            "--max-in-flight",
            "4",
            "--shm-min-free",
            "1M",
        ),
    )
    try:
        wait_for(
            lambda: (s := client_status(out)).get("ok", 0) >= 10 and s.get("in_flight", 0) > 0,
            240,
            "10 samples answered and a batch in flight",
            logs / "client.log",
        )
        own_server.kill()
        down = wait_for(
            lambda: "waiting for /health" in ((s := client_status(out)).get("paused_reason") or "") and s,
            120,
            "the client to wait for the server",
            logs / "client.log",
        )
        assert client.poll() is None, f"the client gave up on a down server:\n{tail(logs / 'client.log')}"
        assert down["failed"] == 0 and down["ok"] < len(exp.samples)
        assert "waiting for /health" in (logs / "client.log").read_text()

        own_server.start()
        assert wait_exit(client, 420, logs / "client.log") == 0, tail(logs / "client.log")
        assert wait_exit(drain, 180, logs / "drain.log") == 0, tail(logs / "drain.log")
    finally:
        stop(client)
        stop(drain)

    assert_training_set_matches(out, exp)
    summary = json.loads((out / ".hsextract" / "client-summary.json").read_text())
    assert summary["ok"] == len(exp.samples) and summary["failed"] == {}
    assert "healthy again" in (logs / "client.log").read_text()
    assert (
        f"{len(exp.samples)} accepted = {len(exp.samples)} in the set + 0 failed + 0 quarantined"
        in (logs / "drain.log").read_text()
    ), "the counts add up"
