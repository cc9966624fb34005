"""The drain's logprob self-check under load, against a real SGLang on CPU, with the drain run as the
``drain_daemon`` unit runs it (``--selfcheck-server`` the run's own server; here every sample is
checked): in a storm of client and drain kills (kill -9, then started again, the drain each time
while one of its check requests is in flight), the check's requests never become samples (the
capture stages nothing of them) and never count in the run's accounts; and a server that dies
mid-check fails no sample silently: the check is tried again, then said not done with its reason,
and the sample is written on its greedy check."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from hsextract.dataset.chat_template import load_tokenizer
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from support.client_run import (
    Expected,
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
from support.drain_proc import drain_status, finish_client, hsextract
from support.recording_proxy import RecordingProxy
from support.server_dumps import capture
from support.sglang_server import start_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LINES = 60
ROUNDS = 3  # each: the client killed mid-run, then the drain killed mid-check
EVERY_SAMPLE = ("--selfcheck-share", "1")


class StagingWatch:
    """Every name the staging directory held while it ran (looked at every few milliseconds)."""

    def __init__(self, dump: Path):
        self.dump = dump
        self.names: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="staging-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.003):
            try:
                self.names.update(os.listdir(self.dump))
            except FileNotFoundError:
                continue

    def __enter__(self) -> StagingWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(10)


@dataclass
class Storm:
    out: Path
    expected: Expected
    checks: list  # the self-check's requests the server answered (request body, status, answer)
    staged_names: set[str]
    drain_kills_mid_check: int
    client_kills: int
    drain_log: str


def client_sent(out: Path) -> int:
    """Requests the running client has sent (its status file; 0 before it writes one)."""
    return int(client_status(out).get("sent", 0))


def _to_the_end(running: dict, key: str, start, log: Path, tries: int = 4) -> None:
    """Run `running[key]` to its end, started again after an exit other than 0, as its unit's
    Restart=always does."""
    rc = -1
    for _ in range(tries):
        rc = wait_exit(running[key], 600, log)
        if rc == 0:
            return
        running[key] = start()
    raise AssertionError(f"{key} exited {rc} {tries} times:\n{tail(log)}")


@pytest.fixture(scope="module")
def storm(llama_server, tiny_llama, free_port, tmp_path_factory) -> Storm:
    """The run, in a storm of kills: each round, the client killed at a random instant once it has
    sent, then the drain while one of its check requests is in flight; both started again."""
    base = tmp_path_factory.mktemp("selfcheck-storm")
    exp = write_mixed_dataset(base / "data.jsonl", load_tokenizer(str(tiny_llama)), n_lines=LINES, seed=11, bad=False)
    out, logs, dump = base / "out", base / "logs", llama_server.dump_dir
    logs.mkdir()
    rng = random.Random(53)
    checks = RecordingProxy(llama_server.url, free_port(), recorded=("/generate",)).start()
    client_args = extract_args(llama_server.url, base / "data.jsonl", tiny_llama, dump, out, "--max-in-flight", "2")

    def drain():
        extra = ("--selfcheck-server", checks.url, *EVERY_SAMPLE)
        return start_drain(logs / "drain.log", dump, out, tiny_llama, "specforge", *extra)

    def client():
        return start_client(logs / "client.log", *client_args)

    drain_kills = client_kills = 0
    running = {"drain": drain(), "client": client()}
    try:
        with StagingWatch(dump) as watch:
            for _ in range(ROUNDS):
                c = running["client"]
                wait_for(lambda c=c: client_sent(out) >= 2 or c.poll() is not None, 300, "the client sending")
                time.sleep(rng.uniform(0.0, 0.3))  # the kill lands at a random instant of the client's run
                if c.poll() is None:
                    stop(c)  # SIGKILL
                    client_kills += 1
                    running["client"] = client()
                d = running["drain"]
                wait_for(
                    lambda d=d: checks.in_flight > 0 or d.poll() is not None, 300, "a check in flight", every=0.002
                )
                if d.poll() is None:
                    stop(d)  # SIGKILL, its check request in flight
                    drain_kills += 1
                running["drain"] = drain()
            _to_the_end(running, "client", client, logs / "client.log")
            _to_the_end(running, "drain", drain, logs / "drain.log")
            names = set(watch.names)
    finally:
        for proc in running.values():
            stop(proc)
        checks.stop()
    return Storm(out, exp, list(checks.exchanges), names, drain_kills, client_kills, (logs / "drain.log").read_text())


def test_in_a_storm_of_kills_the_self_checks_requests_never_become_samples(storm):
    run = json.loads((storm.out / "run.json").read_text())["run_id"]
    assert storm.drain_kills_mid_check >= 1 and storm.client_kills >= 1, (
        storm.drain_kills_mid_check,
        storm.client_kills,
    )
    asked = [body for body, status, _ in storm.checks if body.get("return_logprob")]
    assert len(asked) >= len(storm.expected.samples), "every sample was checked against the server"
    assert not any("rid" in body for body in asked), "a check carries no rid"
    # A dump is a directory named by its rid (dot names are the staging's own: trash, write probes).
    # The shared server's staging may also take late dumps of an earlier test's killed client, named
    # for that test's run and left alone by this drain as a user's other run's are; a check's request
    # would be staged under SGLang's own rid (it carries none) or under one of this run's.
    ours = re.compile(rf"hsx-{run}-(\d+|p[0-9a-f]+)")
    earlier_run = re.compile(r"hsx-(?!" + run + r"-)[0-9a-f]{8}-(\d+|p[0-9a-f]+)")
    others = {n for n in storm.staged_names if n[0] not in "._" and not ours.fullmatch(n)}
    strays = {n for n in others if not earlier_run.fullmatch(n)}
    assert not strays, f"staged during the storm, and a sample or probe of no run: {sorted(strays)[:5]}"
    assert_training_set_matches(storm.out, storm.expected)  # each sample once, with its own tokens
    foreign = drain_status(storm.out).get("foreign") or {}
    assert "unknown" not in foreign, f"the drain met dumps named for no run: {foreign}"


def test_in_a_storm_of_kills_the_self_checks_requests_never_count_in_the_accounts(storm):
    n = len(storm.expected.samples)
    assert f"{LINES} dataset lines = {n} accepted + 0 rejected" in storm.drain_log
    assert f"{n} accepted = {n} in the set + 0 failed + 0 quarantined" in storm.drain_log
    status = hsextract("status", "--output", str(storm.out), "--json")
    assert status.returncode == 0, status.stdout
    accounts = json.loads(status.stdout)["accounts"]
    assert (accounts["accepted"], accounts["in_set"], accounts["unaccounted"]) == (n, n, []), accounts
    assert sum(accounts["failed"].values()) == sum(accounts["quarantined"].values()) == 0, accounts
    assert len(storm.checks) > n, "the server answered more prefills than the run has samples"


def _drain_connections(drain_pid: int, port: int) -> int:
    """Connections the drain's process holds open to the server's port (its self-check's asks)."""
    try:
        conns = psutil.Process(drain_pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return 0
    return sum(1 for c in conns if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def test_a_server_that_dies_mid_check_fails_no_sample_silently(llama_server, tiny_llama, free_port, tmp_path):
    dump, hold, out, logs = tmp_path / "dump", tmp_path / "hold", tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    run = load_or_create_run_id(out)
    n, first = 8, 3
    captured = capture(llama_server, dump, hold, run, list(range(n)), seed=77)
    checked = start_server(tiny_llama, port=free_port(), dump_dir=tmp_path / "unused", log_dir=logs, capture=False)
    port = int(checked.url.rsplit(":", 1)[1])
    for i in range(first):
        shutil.move(str(hold / captured[i].rid), str(dump / captured[i].rid))
    drain = start_drain(
        logs / "drain.log", dump, out, tiny_llama, "specforge", "--selfcheck-server", checked.url, *EVERY_SAMPLE
    )
    try:
        lp = lambda: (drain_status(out).get("selfcheck") or {}).get("logprob") or {}  # noqa: E731
        wait_for(lambda: lp().get("compared") == first, 300, "the first samples compared", logs / "drain.log")
        os.killpg(checked.proc.pid, signal.SIGSTOP)  # it takes the next ask and never answers it...
        for i in range(first, n):
            shutil.move(str(hold / captured[i].rid), str(dump / captured[i].rid))
        wait_for(lambda: _drain_connections(drain.pid, port), 300, "a check request in flight", every=0.01)
        os.killpg(checked.proc.pid, signal.SIGKILL)  # ... and dies with it in flight
        checked.proc.wait(30)
        finish_client(out, n)
        assert wait_exit(drain, 300, logs / "drain.log") == 0, tail(logs / "drain.log")
    finally:
        stop(drain)
        checked.stop()
    log = (logs / "drain.log").read_text()
    assert sorted(e.dataset_index for e in iter_entries(out)) == list(range(n)), "every sample is in the set"
    assert {e.greedy_check for e in iter_entries(out)} == {"passed"}, "each on its greedy check at least"
    s = drain_status(out)["selfcheck"]
    lp_counts = s["logprob"]
    assert s["checked"] == n and lp_counts["compared"] == first, s
    assert lp_counts["not_done"] == n - first, "every sample checked is compared or said not done"
    assert set(lp_counts["not_done_by_reason"]) <= {"server_unreachable", "server_unreachable_recently"}, lp_counts
    assert lp_counts["not_done_by_reason"].get("server_unreachable", 0) >= 1, lp_counts
    assert "logprob self-check not done: the server did not answer (3 attempts, the last:" in log, "retried first"
    assert f"logprob self-check NOT DONE for {n - first} of {n} greedy-checked samples" in log
    assert f"{n} accepted = {n} in the set + 0 failed + 0 quarantined" in log
