"""Several client processes on one output (``--process j/P``), on the session's real SGLang server
and the real drain: one killed with SIGKILL mid-run, both run again, and the training set holds
every accepted sample exactly once, with the accounts exact and `hsextract status` done and ok.

A host whose server runs with data parallelism takes more requests than one client process can
prepare, so the play runs P processes on sub-shards of the host's shard, sharing one output, one
run id and one drain (docs/configuration.md, "Several client processes").
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter

import pytest
from hsextract.dataset.chat_template import load_tokenizer
from hsextract.shard import Shard
from support.client_run import (
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
from support.drain_proc import drain_status

pytestmark = pytest.mark.server


def _state(out, name: str) -> dict:
    try:
        return json.loads((out / ".hsextract" / name).read_text())
    except (OSError, ValueError):
        return {}


def _written(out, shard: Shard) -> int:
    """How many samples of `shard` the drain has written to the training set so far."""
    from hsextract.output.manifest import iter_entries

    return sum(1 for e in iter_entries(out) if shard.takes(e.dataset_index))


def _mid_run_with_samples_written(out, pid: int, unsent: int) -> bool:
    """Process 1 of 2 (sub-shard 1/2) runs, the drain has written some of its samples, and at least
    `unsent` of its shard are not sent yet: a kill now interrupts a run with work on both sides."""
    s = _state(out, "client-status.shard-1-of-2.json")
    return (
        s.get("pid") == pid
        and s.get("state") == "running"
        and _written(out, Shard(1, 2)) >= 5
        and s.get("sent", 0) + s.get("skipped", 0) <= s.get("samples_total", 0) - unsent
    )


def test_two_processes_of_one_output_resume_after_kill_9_with_every_sample_once(llama_server, tiny_llama, tmp_path):
    exp = write_mixed_dataset(tmp_path / "data.jsonl", load_tokenizer(tiny_llama), n_lines=120, seed=2)
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()

    def process(j: int) -> subprocess.Popen:
        return start_client(
            logs / f"client-{j}.log",
            *extract_args(
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
                "--process",
                f"{j}/2",
            ),
        )

    drain = start_drain(logs / "drain.log", llama_server.dump_dir, out, tiny_llama)
    procs: list[subprocess.Popen] = []
    try:
        # Up before the clients, as the units start them: a drain still importing torch while a fast
        # client sent its whole sub-shard left no moment with samples written and 20 unsent.
        wait_for(lambda: drain_status(out).get("state") == "running", 300, "the drain running", logs / "drain.log")
        procs = [process(0), process(1)]
        wait_for(
            lambda: _mid_run_with_samples_written(out, procs[1].pid, unsent=20),
            300,
            "process 1/2 running with samples written and 20 not yet sent",
            logs / "client-1.log",
        )
        stop(procs[1], signal.SIGKILL)
        assert wait_exit(procs[0], 420, logs / "client-0.log") == 0, "the other process finishes its sub-shard"
        assert drain.poll() is None, "the drain waits for the killed process's sub-shard"
        assert not (out / ".hsextract" / "client-summary.shard-1-of-2.json").exists()

        procs = [process(0), process(1)]  # as systemd starts every instance again
        for j, proc in enumerate(procs):
            assert wait_exit(proc, 420, logs / f"client-{j}.log") == 0, tail(logs / f"client-{j}.log")
        assert wait_exit(drain, 180, logs / "drain.log") == 0, tail(logs / "drain.log")
    finally:
        for proc in procs:
            stop(proc)
        stop(drain)

    assert_training_set_matches(out, exp)  # every accepted sample, each exactly once
    summaries = [_state(out, f"client-summary.shard-{j}-of-2.json") for j in range(2)]
    assert [s["shard"] for s in summaries] == [[0, 2], [1, 2]]
    assert summaries[1]["skipped"] > 0, "the killed process resumed: it skipped what was written before the kill"
    rejects = [
        json.loads(line)
        for path in sorted((out / ".hsextract").glob("rejects*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert Counter(r["index"] for r in rejects) == Counter(list(exp.rejects)), "each bad line reported exactly once"

    status = subprocess.run(
        [sys.executable, "-m", "hsextract", "status", "--output", str(out), "--json"],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(status.stdout)
    assert status.returncode == 0 and report["ok"], status.stdout + status.stderr
    assert report["client"]["state"] == "done" and report["client"]["shards"] == ["0/2", "1/2"]
    acc = report["accounts"]
    assert acc["final"] and acc["unaccounted"] == [] and acc["lines"] == exp.total_lines
    assert acc["accepted"] == acc["in_set"] + sum(acc["failed"].values()) + sum(acc["quarantined"].values())
    assert acc["in_set"] == len(exp.samples)
