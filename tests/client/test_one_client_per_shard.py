"""A client holds the lock of its shard of the output: clients of disjoint shards of one output run
side by side, a client whose shard shares a sample with a running client's refuses in one line
naming it, and a client killed with SIGKILL leaves its shard to the next one at once.

Two clients of one output once took the same request ids: the server refused one of each pair,
the drain threw the other's dumps away, and the run ended with a sample nobody could account for.

The clients here wait for a server that is not there: they hold their lock from before that wait
(the real command, as a process; no SGLang needed to hold a shard).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hsextract.shard import Shard
from support.client_run import env, stop, tail, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ((0, 1), (1, 2), True),  # the whole dataset overlaps every shard
        ((1, 2), (2, 4), False),  # odd indices, and 2, 6, 10...: never one index
        ((1, 2), (3, 4), True),  # 3, 7, 11... are odd
        ((0, 2), (1, 3), True),  # 3 (and 9, 15...)
        ((0, 4), (1, 4), False),
        ((2, 6), (1, 4), False),  # 2 mod 6 is even, 1 mod 4 is odd
        ((2, 6), (0, 4), True),  # 8
    ],
)
def test_two_shards_overlap_exactly_when_some_dataset_index_belongs_to_both(a, b, overlap):
    both = [x for x in range(a[1] * b[1] * 2) if x % a[1] == a[0] and x % b[1] == b[0]]
    assert bool(both) is overlap, "the table itself"
    assert Shard(*a).overlaps(Shard(*b)) is overlap and Shard(*b).overlaps(Shard(*a)) is overlap


def _client(tmp_path: Path, model: Path, port: int, shard: str, name: str) -> tuple[subprocess.Popen, Path]:
    data = tmp_path / "data.jsonl"
    if not data.exists():
        data.write_text(
            "".join(
                json.dumps(
                    {
                        "messages": [
                            {"role": "user", "content": f"question {i}"},
                            {"role": "assistant", "content": f"answer {i}"},
                        ]
                    }
                )
                + "\n"
                for i in range(8)
            )
        )
    log = tmp_path / f"{name}.log"
    args = [
        sys.executable,
        "-m",
        "hsextract",
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
        "--shard",
        shard,
    ]
    proc = subprocess.Popen(args, env=env(), stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def _lock_holder(out: Path, shard: str) -> int | None:
    i, n = shard.split("/")
    try:
        return json.loads((out / ".hsextract" / f"client-{i}-of-{n}.lock").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def _waiting_for_the_server(out: Path, shard: str, pid: int) -> bool:
    i, n = shard.split("/")
    name = "client-status.json" if shard == "0/1" else f"client-status.shard-{i}-of-{n}.json"
    try:
        status = json.loads((out / ".hsextract" / name).read_text())
    except (OSError, ValueError):
        return False
    return status.get("pid") == pid and "waiting for the server" in (status.get("paused_reason") or "")


def _start_and_hold(tmp_path: Path, model: Path, port: int, shard: str, name: str) -> subprocess.Popen:
    proc, log = _client(tmp_path, model, port, shard, name)
    wait_for(
        lambda: (
            _lock_holder(tmp_path / "out", shard) == proc.pid
            and _waiting_for_the_server(tmp_path / "out", shard, proc.pid)
        ),
        180,
        f"client {name} to hold shard {shard}",
        log,
    )
    return proc


def _refused(tmp_path: Path, model: Path, port: int, shard: str, name: str) -> str:
    proc, log = _client(tmp_path, model, port, shard, name)
    try:
        rc = proc.wait(180)
    finally:
        stop(proc)
    assert rc == 75, f"client of shard {shard} exited {rc}:\n{tail(log)}"
    lines = [line for line in log.read_text().splitlines() if "error:" in line]
    assert len(lines) == 1, tail(log)
    return lines[0]


def test_clients_of_overlapping_shards_refuse_and_disjoint_ones_run_side_by_side(tmp_path, tiny_llama, free_port):
    port = free_port()  # nothing listens: each client waits for the server, holding its shard
    out = tmp_path / "out"
    held: list[subprocess.Popen] = []
    try:
        held.append(_start_and_hold(tmp_path, tiny_llama, port, "1/2", "odd"))
        odd = held[0].pid
        for shard, why in (
            ("1/2", "which runs this client's shard 1/2:"),
            ("3/4", "whose shard shares samples with this client's shard 3/4:"),
            ("0/1", "whose shard shares samples with this client's shard 0/1:"),
        ):
            line = _refused(tmp_path, tiny_llama, port, shard, f"refused-{shard.replace('/', '-')}")
            assert (
                f"is in use by hsextract extract of shard 1/2 (pid {odd} on {socket.gethostname()}, since " in line
                and why in line
            ), line
        held.append(_start_and_hold(tmp_path, tiny_llama, port, "2/4", "disjoint"))  # 2, 6, 10...: never odd
        assert held[0].poll() is None and _lock_holder(out, "1/2") == odd, "the first client is untouched"
        assert not (out / ".hsextract" / "client-status.json").exists(), "no client wrote another's status file"
    finally:
        for proc in held:
            stop(proc)


def test_a_client_killed_with_sigkill_leaves_its_shard_to_the_next_client_at_once(tmp_path, tiny_llama, free_port):
    port = free_port()
    killed = _start_and_hold(tmp_path, tiny_llama, port, "0/1", "killed")
    killed.send_signal(signal.SIGKILL)
    killed.wait(30)
    nxt = None
    try:
        nxt = _start_and_hold(tmp_path, tiny_llama, port, "0/1", "next")
        assert nxt.poll() is None
    finally:
        stop(killed)
        stop(nxt)
