"""A request the server has not answered within ``--request-timeout`` is not lost, on the session's
real SGLang server: the client waits on while the server is healthy (closing the connection would
make SGLang abort the request), and a send that meets SGLang's ``Duplicate request ID`` answer (it
still holds an earlier send of the rid) waits for that earlier send instead of failing the sample.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import uuid

import psutil
import pytest
import requests
from hsextract.client.sender import Sender
from hsextract.retry import RetryPolicy
from hsextract.staging.dumps import DONE_FILE, discard_dump, rid_dir
from hsextract.staging.records import make_rid
from support.client_run import (
    extract_args,
    start_client,
    start_drain,
    stop,
    tail,
    training_set,
    wait_exit,
    wait_for,
)

pytestmark = pytest.mark.server

LONG_PROMPT = 1500  # tokens: with the server's 16-token chunks and 4096-token pool, seconds each on CPU


def _long_prompts(path, n: int) -> list[list[int]]:
    prompts = [[1, *(4 + (i * 7 + j) % 290 for j in range(LONG_PROMPT - 1))] for i in range(n)]
    path.write_text("".join(json.dumps({"input_ids": ids}) + "\n" for ids in prompts))
    return prompts


def test_a_tiny_request_timeout_on_long_prompts_puts_every_sample_in_the_set(llama_server, tiny_llama, tmp_path):
    prompts = _long_prompts(tmp_path / "long.jsonl", 6)
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    drain = start_drain(logs / "drain.log", llama_server.dump_dir, out, tiny_llama)
    client = start_client(
        logs / "client.log",
        *extract_args(
            llama_server.url,
            tmp_path / "long.jsonl",
            tiny_llama,
            llama_server.dump_dir,
            out,
            "--request-timeout",
            "1",
            "--max-in-flight",
            "6",
        ),
    )
    try:
        assert wait_exit(client, 420, logs / "client.log") == 0, tail(logs / "client.log")
        assert wait_exit(drain, 180, logs / "drain.log") == 0, tail(logs / "drain.log")
    finally:
        stop(client)
        stop(drain)
    client_log = (logs / "client.log").read_text()
    assert "the server is healthy and still holds it: waiting on" in client_log, "no request outlived the timeout"
    summary = json.loads((out / ".hsextract" / "client-summary.json").read_text())
    assert summary["ok"] == len(prompts) and summary["failed"] == {}, summary
    written = training_set(out)
    assert sorted(written) == list(range(len(prompts)))
    assert all(len(samples) == 1 and samples[0]["input_ids"].tolist() == prompts[i] for i, samples in written.items())


def _scheduler(server) -> psutil.Process:
    (proc,) = [
        p
        for p in psutil.Process(server.proc.pid).children(recursive=True)
        if p.name().startswith("sglang::schedul") or "sglang::scheduler" in " ".join(p.cmdline())
    ]
    return proc


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_send_the_server_still_holds_waits_for_the_earlier_one_and_takes_its_dump(llama_server):
    """An earlier send of the rid is in the server, held there (its scheduler stopped mid-prefill);
    the client sends the rid again, as after a lost connection or a client restarted within SGLang's
    disconnect check: it waits instead of failing, and once the earlier send is staged the sample is
    answered, with the earlier send's dump."""
    rid = make_rid(llama_server.rid_prefix, uuid.uuid4().hex[:12], 0)
    ids = [1, *(4 + j % 290 for j in range(LONG_PROMPT - 1))]
    staged = rid_dir(llama_server.dump_dir, rid)
    scheduler = _scheduler(llama_server)
    lines = _Lines()
    sender_log = logging.getLogger("hsextract.client.sender")
    level = sender_log.level
    sender_log.setLevel(logging.INFO)
    sender_log.addHandler(lines)
    sender = Sender(
        llama_server.url,
        RetryPolicy(max_attempts=1, read_timeout_s=60),
        settled=lambda r: (rid_dir(llama_server.dump_dir, r) / DONE_FILE).exists(),
    )
    answers: dict[str, object] = {}
    earlier = threading.Thread(
        daemon=True,
        target=lambda: answers.setdefault(
            "earlier", requests.post(f"{llama_server.url}/generate", timeout=300, json=Sender.payload(rid, ids))
        ),
    )
    again = threading.Thread(daemon=True, target=lambda: answers.setdefault("again", sender.send(rid, ids)))
    try:
        earlier.start()
        wait_for(staged.exists, 120, "the capture to stage the earlier send's first chunk")
        os.kill(scheduler.pid, signal.SIGSTOP)
        assert not (staged / DONE_FILE).exists(), "the earlier send finished before it could be held"
        again.start()
        wait_for(
            lambda: any("still holds an earlier send" in line for line in lines.lines),
            60,
            "the server's duplicate-rid answer",
        )
        assert again.is_alive() and "again" not in answers, "the sample must wait for the earlier send, not fail"
        os.kill(scheduler.pid, signal.SIGCONT)
        again.join(300)
        res = answers["again"]
        assert res.ok and res.attempts == 1, res
        assert (staged / DONE_FILE).exists()
        earlier.join(300)
        assert answers["earlier"].status_code == 200
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(scheduler.pid, signal.SIGCONT)
        sender_log.removeHandler(lines)
        sender_log.setLevel(level)
        earlier.join(300)
        again.join(300)
        discard_dump(staged)
