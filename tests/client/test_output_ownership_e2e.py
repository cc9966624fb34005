"""The client, the drain and an output directory they share, on the session's real SGLang server
with the capture on (the real commands, as processes):

* clients of disjoint shards of one output fill it side by side, and one drain accounts for every
  sample of both;
* a client given a relative ``--output`` writes records any drain of that output takes;
* a start refused on a finished output leaves that run's files as they were and says why in
  ``hsextract status``;
* a client whose ``--dump-dir`` is not its server's removes its probe's dump from the server's
  staging directory and names that directory;
* a drain started before a rerun's client waits for that client.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hsextract.dataset.chat_template import load_tokenizer
from hsextract.staging.announcements import live_announcements, process_start_ticks
from hsextract.staging.records import parse_rid, read_record
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
from support.drain_proc import hsextract

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]

LIMITS = ("--max-tokens", "300", "--overlong", "skip", "--max-in-flight", "4")


def _run_id(out: Path) -> str:
    return json.loads((out / "run.json").read_text())["run_id"]


def _forget_run(dump: Path, out: Path) -> None:
    """Remove what a test's run left in the shared server's staging directory."""
    if not (out / "run.json").exists():
        return
    run_id = _run_id(out)
    for p in [*dump.glob(f"*-{run_id}-*"), *dump.glob(f"_records/*-{run_id}-*")]:
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def _lock_pid(out: Path, shard: str) -> int | None:
    i, n = shard.split("/")
    try:
        return json.loads((out / ".hsextract" / f"client-{i}-of-{n}.lock").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def test_clients_of_disjoint_shards_fill_one_output_and_one_drain_accounts_for_every_sample(
    llama_server, tiny_llama, tmp_path
):
    exp = write_mixed_dataset(tmp_path / "data.jsonl", load_tokenizer(tiny_llama), n_lines=60, seed=11)
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    clients, drain = [], None
    try:
        for shard in ("0/2", "1/2"):
            clients.append(
                start_client(
                    logs / f"client-{shard[0]}.log",
                    *extract_args(
                        llama_server.url,
                        tmp_path / "data.jsonl",
                        tiny_llama,
                        llama_server.dump_dir,
                        out,
                        *LIMITS,
                        "--shard",
                        shard,
                    ),
                )
            )
        # Both hold their shard before the drain looks: one finishing before the other started would
        # be a finished run of one shard (see hsextract.output.client_files).
        wait_for(
            lambda: [_lock_pid(out, s) for s in ("0/2", "1/2")] == [c.pid for c in clients],
            240,
            "both clients to hold their shards",
            logs / "client-1.log",
        )
        drain = start_drain(logs / "drain.log", llama_server.dump_dir, out, tiny_llama)
        for i, client in enumerate(clients):
            assert wait_exit(client, 420, logs / f"client-{i}.log") == 0, tail(logs / f"client-{i}.log")
        assert wait_exit(drain, 180, logs / "drain.log") == 0, tail(logs / "drain.log")
    finally:
        for client in clients:
            stop(client)
        stop(drain)
        _forget_run(llama_server.dump_dir, out)
    assert_training_set_matches(out, exp)
    accepted = len(exp.samples)
    assert f"{accepted} accepted = {accepted} in the set + 0 failed + 0 quarantined" in (logs / "drain.log").read_text()
    state = out / ".hsextract"
    summaries = [json.loads((state / f"client-summary.shard-{i}-of-2.json").read_text()) for i in (0, 1)]
    assert sum(s["ok"] for s in summaries) == accepted and all(s["failed"] == {} for s in summaries)
    rejects = [
        json.loads(line) for i in (0, 1) for line in (state / f"rejects.shard-{i}-of-2.jsonl").read_text().splitlines()
    ]
    assert {r["index"]: r["reason"] for r in rejects} == exp.rejects, "each bad line once, by the client of its shard"
    r = hsextract("status", "--output", str(out), "--json", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    status = json.loads(r.stdout)
    assert status["client"]["state"] == "done" and status["client"]["ok"] == accepted
    assert status["accounts"]["in_set"] == accepted and status["accounts"]["unaccounted"] == []


def test_a_client_given_a_relative_output_writes_records_the_drain_takes(llama_server, tiny_llama, tmp_path):
    exp = write_mixed_dataset(tmp_path / "data.jsonl", load_tokenizer(tiny_llama), n_lines=12, seed=12, bad=False)
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    args = extract_args(
        llama_server.url, tmp_path / "data.jsonl", tiny_llama, llama_server.dump_dir, Path("out"), *LIMITS
    )
    client = subprocess.Popen(
        args, env=env(), cwd=tmp_path, stdout=(logs / "client.log").open("ab"), stderr=subprocess.STDOUT
    )
    drain = None
    try:
        assert wait_exit(client, 420, logs / "client.log") == 0, tail(logs / "client.log")
        records = [read_record(llama_server.dump_dir, f"hsx-{_run_id(out)}-{i}") for i in exp.samples]
        assert {r.output for r in records if r} == {str(out.resolve())}, "the records name the resolved path"
        drain = start_drain(logs / "drain.log", llama_server.dump_dir, out, tiny_llama)  # its own working directory
        assert wait_exit(drain, 180, logs / "drain.log") == 0, tail(logs / "drain.log")
    finally:
        stop(client)
        stop(drain)
        _forget_run(llama_server.dump_dir, out)
    assert_training_set_matches(out, exp)


def _finished_run(server, model: Path, tmp_path: Path, lines: int, seed: int) -> tuple[Path, Path, list[str]]:
    """An output with a finished, drained run of a small dataset; (output, logs, client args)."""
    write_mixed_dataset(tmp_path / "data.jsonl", load_tokenizer(model), n_lines=lines, seed=seed)
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    args = extract_args(server.url, tmp_path / "data.jsonl", model, server.dump_dir, out, *LIMITS)
    client = start_client(logs / "client.log", *args)
    drain = start_drain(logs / "drain.log", server.dump_dir, out, model)
    try:
        assert wait_exit(client, 420, logs / "client.log") == 0, tail(logs / "client.log")
        assert wait_exit(drain, 180, logs / "drain.log") == 0, tail(logs / "drain.log")
    finally:
        stop(client)
        stop(drain)
    return out, logs, args


def _elsewhere(server, tmp_path: Path) -> Path:
    """A staging directory beside the server's own (a mistyped --dump-dir)."""
    return server.dump_dir.parent / f"not-the-capture-dir-{tmp_path.name}"


def _with_dump_dir(args: list[str], dump: Path) -> list[str]:
    args = list(args)
    args[args.index("--dump-dir") + 1] = str(dump)
    return args


def test_a_refused_start_on_a_finished_output_keeps_the_run_and_status_says_why(llama_server, tiny_llama, tmp_path):
    out, _, args = _finished_run(llama_server, tiny_llama, tmp_path, lines=20, seed=13)
    state = out / ".hsextract"
    kept = {name: (state / name).read_bytes() for name in ("client-summary.json", "rejects.jsonl", "failures.jsonl")}
    before = hsextract("status", "--output", str(out), timeout=120)
    assert before.returncode == 0 and before.stdout.startswith("The run is done"), before.stdout
    elsewhere = _elsewhere(llama_server, tmp_path)
    try:
        r = subprocess.run(
            [*_with_dump_dir(args, elsewhere), "--probe-timeout", "5"],
            env=env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)
        _forget_run(llama_server.dump_dir, out)
    assert r.returncode == 2 and "no dump of it appeared" in r.stderr, r.stderr[-3000:]
    assert {name: (state / name).read_bytes() for name in kept} == kept, "the finished run's files are as they were"
    status = json.loads((state / "client-status.json").read_text())
    assert status["state"] == "done", status
    assert "no dump of it appeared" in status["start_refused"]["error"], status
    after = hsextract("status", "--output", str(out), timeout=120)
    assert after.returncode == 1, after.stdout
    assert after.stdout.startswith("The run is done"), after.stdout
    assert "FAIL: the client's start at " in after.stdout and "was refused: the server" in after.stdout, after.stdout
    assert "run it again to resume" not in after.stdout


def test_a_client_staging_elsewhere_removes_its_probe_from_the_servers_staging_and_names_it(
    llama_server, tiny_llama, tmp_path
):
    data = tmp_path / "data.jsonl"
    write_mixed_dataset(data, load_tokenizer(tiny_llama), n_lines=3, seed=14, bad=False)
    out, elsewhere = tmp_path / "out", _elsewhere(llama_server, tmp_path)
    try:
        r = subprocess.run(
            [*extract_args(llama_server.url, data, tiny_llama, elsewhere, out), "--probe-timeout", "5"],
            env=env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        run_id = _run_id(out)
        left = [d.name for d in llama_server.dump_dir.iterdir() if (p := parse_rid(d.name)) and p.run_id == run_id]
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)
        _forget_run(llama_server.dump_dir, out)
    assert r.returncode == 2, r.stderr[-3000:]
    assert left == [], "the probe's dump is not left in the server's staging directory"
    assert f"The server's capture stages into {llama_server.dump_dir.resolve()}" in r.stderr, r.stderr[-3000:]
    assert f"run with --dump-dir {llama_server.dump_dir.resolve()}" in r.stderr


def test_the_servers_capture_announces_its_process_with_its_start_time(llama_server):
    (ann,) = [a for a in live_announcements(llama_server.dump_dir) if a.port == llama_server.port]
    assert ann.proc_start and ann.proc_start == process_start_ticks(ann.pid)


def test_a_drain_started_before_a_rerun_client_drains_the_rerun(llama_server, tiny_llama, tmp_path):
    out, logs, args = _finished_run(llama_server, tiny_llama, tmp_path, lines=12, seed=15)
    data = tmp_path / "data.jsonl"
    first = data.read_bytes()
    grown = write_mixed_dataset(data, load_tokenizer(tiny_llama), n_lines=16, seed=15)  # four rows appended
    assert data.read_bytes().startswith(first), "the rows of the first run are the same rows"
    drain = start_drain(logs / "drain.log", llama_server.dump_dir, out, tiny_llama)
    client = None
    try:
        wait_for(
            lambda: (
                "waiting for the next client run to finish" in (logs / "drain.log").read_text()
                or drain.poll() is not None
            ),
            120,
            "the drain to see that the summary is the last run's",
            logs / "drain.log",
        )
        assert drain.poll() is None, f"exited on the last run's summary:\n{tail(logs / 'drain.log')}"
        client = start_client(logs / "client.log", *args)
        assert wait_exit(client, 420, logs / "client.log") == 0, tail(logs / "client.log")
        assert wait_exit(drain, 180, logs / "drain.log") == 0, tail(logs / "drain.log")
    finally:
        stop(client)
        stop(drain)
        _forget_run(llama_server.dump_dir, out)
    assert_training_set_matches(out, grown)
