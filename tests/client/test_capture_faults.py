"""Batches the capture fails inside a real server, and clients killed mid-prefill, lose no sample:
each ends in the training set exactly once, or in the client's failures with its reason, and the
run's counts add up.

``faulty_server`` runs with the capture's test-only fault switch: every 4th prefill batch (of
requests it has not failed before) is failed through the path a real failure to queue takes, so
the capture leaves ``failed.json`` for each of its requests. The kill test uses the suite's shared
``llama_server``, whose capture fails nothing of its own.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hsextract.dataset.chat_template import load_tokenizer
from hsextract.staging.dumps import DONE_FILE, STATES_FILE
from support.client_run import (
    Expected,
    assert_training_set_matches,
    env,
    extract_args,
    start_client,
    start_drain,
    stop,
    tail,
    wait_exit,
    wait_for,
    write_mixed_dataset,
)
from support.sglang_server import start_server

pytestmark = pytest.mark.server

FAIL_EVERY = 4


@pytest.fixture(scope="module")
def faulty_server(tiny_llama, free_port, tmp_path_factory):
    base = tmp_path_factory.mktemp("faulty-server")
    handle = start_server(
        tiny_llama,
        port=free_port(),
        dump_dir=base / "dump",
        log_dir=base / "logs",
        capture_extra={"pool_granularity_bytes": 1024, "testonly_fail_every_kth_batch": FAIL_EVERY},
    )
    try:
        yield handle
    finally:
        handle.stop_later()


def _status(out: Path) -> tuple[int, dict]:
    r = subprocess.run(
        [sys.executable, "-m", "hsextract", "status", "--output", str(out), "--json"],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r.returncode, json.loads(r.stdout)


def _run(server, model: Path, tmp_path: Path, n_lines: int, *client_flags: str) -> tuple[Path, object, int, int]:
    exp = write_mixed_dataset(tmp_path / "data.jsonl", load_tokenizer(model), n_lines=n_lines, seed=5)
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    drain = start_drain(logs / "drain.log", server.dump_dir, out, model)
    client = start_client(
        logs / "client.log",
        *extract_args(
            server.url,
            tmp_path / "data.jsonl",
            model,
            server.dump_dir,
            out,
            "--max-in-flight",
            "4",
            "--max-tokens",
            "300",
            "--overlong",
            "skip",
            *client_flags,
        ),
    )
    try:
        client_rc = wait_exit(client, 420, logs / "client.log")
        drain_rc = wait_exit(drain, 180, logs / "drain.log")
    finally:
        stop(client)
        stop(drain)
    return out, exp, client_rc, drain_rc


def test_failed_batches_are_sent_again_and_every_sample_lands_once(faulty_server, tiny_llama, tmp_path):
    out, exp, client_rc, drain_rc = _run(faulty_server, tiny_llama, tmp_path, 50)
    assert client_rc == 0, tail(tmp_path / "logs" / "client.log")
    assert drain_rc == 0, tail(tmp_path / "logs" / "drain.log")
    assert_training_set_matches(out, exp)
    summary = json.loads((out / ".hsextract" / "client-summary.json").read_text())
    assert summary["retried"].get("capture_failed", 0) >= 1, "the switch failed batches, and they were sent again"
    assert summary["failed"] == {} and summary["ok"] == len(exp.samples)
    rc, status = _status(out)
    accounts = status["accounts"]
    assert rc == 0 and accounts["final"] and accounts["unaccounted"] == []
    assert accounts["lines"] == 50 and accounts["in_set"] == len(exp.samples)
    assert sum(accounts["rejected"].values()) == len(exp.rejects)


def test_without_retries_the_failed_samples_are_reported_and_the_run_fails_its_check(
    faulty_server, tiny_llama, tmp_path
):
    out, exp, client_rc, drain_rc = _run(faulty_server, tiny_llama, tmp_path, 30, "--max-attempts", "1")
    assert client_rc == 0, tail(tmp_path / "logs" / "client.log")
    assert drain_rc == 3, "more than 1 % of the samples failed: the run fails its check"
    failures = [json.loads(line) for line in (out / ".hsextract" / "failures.jsonl").read_text().splitlines()]
    assert failures and all(f["reason"] == "capture_failed" and "fault_injected" in f["detail"] for f in failures)
    rc, status = _status(out)
    accounts = status["accounts"]
    assert rc == 1 and accounts["final"] and accounts["unaccounted"] == []
    assert accounts["in_set"] + sum(accounts["failed"].values()) == accounts["accepted"] == len(exp.samples)
    assert any("failed" in p and "failures.jsonl" in p for p in status["problems"]), status["problems"]
    drain_log = (tmp_path / "logs" / "drain.log").read_text()
    assert f"{len(failures)} of {len(exp.samples)} accepted samples failed" in drain_log


LONG = 1500  # tokens a prompt: about 94 chunks of the server's 16-token chunked prefill


def _in_prefill(dump: Path, out: Path) -> list[str]:
    """Rids of this run whose dump the capture has begun (its file is created at the first chunk)
    and not finished: requests the server is prefilling right now."""
    try:
        run = json.loads((out / "run.json").read_text())["run_id"]
    except (OSError, ValueError, KeyError):
        return []
    mine = re.compile(rf"hsx-{run}-\d+")
    return [
        d.name
        for d in dump.iterdir()
        if mine.fullmatch(d.name) and (d / STATES_FILE).exists() and not (d / DONE_FILE).exists()
    ]


def test_a_client_killed_mid_prefill_and_started_again_loses_and_quarantines_nothing(
    llama_server, tiny_llama, tmp_path
):
    """kill -9 of the client drops its connections: SGLang aborts the requests it is prefilling, and
    the capture is not told. The client started again sends them anew under the same rids; each must
    be staged as that one send, not merged into the aborted one (a fingerprint_mismatch)."""
    server = llama_server
    rng = random.Random(7)
    prompts = [[rng.randrange(10, 300) for _ in range(LONG)] for _ in range(6)]
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps({"input_ids": ids, "loss_mask": [1] * len(ids)}) + "\n" for ids in prompts))
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    args = extract_args(
        server.url, data, tiny_llama, server.dump_dir, out, "--max-in-flight", "2", "--max-tokens", "2000"
    )
    drain = start_drain(logs / "drain.log", server.dump_dir, out, tiny_llama)
    client = start_client(logs / "client-killed.log", *args)
    try:
        killed = wait_for(
            lambda: _in_prefill(server.dump_dir, out),
            180,
            "a request mid-prefill",
            logs / "client-killed.log",
            every=0.05,
        )
        stop(client)  # SIGKILL
        client = start_client(logs / "client.log", *args)
        client_rc = wait_exit(client, 420, logs / "client.log")
        drain_rc = wait_exit(drain, 180, logs / "drain.log")
    finally:
        stop(client)
        stop(drain)
    assert client_rc == 0, tail(logs / "client.log")
    drain_log = (logs / "drain.log").read_text()
    assert drain_rc == 0, drain_log[-3000:]
    assert "6 accepted = 6 in the set + 0 failed + 0 quarantined" in drain_log, (killed, drain_log[-3000:])
    assert_training_set_matches(
        out, Expected({i: (ids, [1] * LONG) for i, ids in enumerate(prompts)}, total_lines=len(prompts))
    )
