"""The client end to end, on the session's real SGLang server with the capture on, and the real drain.

Both commands run as subprocesses, as their systemd units run them, side by side: the drain
moves dumps while the client sends, and exits when the client's summary says it has finished.
"""

from __future__ import annotations

import json
import signal
from collections import Counter

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

pytestmark = pytest.mark.server


def _summary(output):
    """The client's summary (client-summary.json; client-summary.shard-i-of-n.json of a shard's client)."""
    (path,) = (output / ".hsextract").glob("client-summary*.json")
    return json.loads(path.read_text())


def _done(output) -> int:
    s = client_status(output)
    return s.get("ok", 0) + s.get("skipped", 0)


def test_mixed_dataset_reaches_the_training_set_with_exactly_the_valid_samples(llama_server, tiny_llama, tmp_path):
    exp = write_mixed_dataset(tmp_path / "data.jsonl", load_tokenizer(tiny_llama), n_lines=100)
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    drain = start_drain(logs / "drain.log", llama_server.dump_dir, out, tiny_llama)
    client = start_client(
        logs / "client.log",
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
            "4",
        ),
    )
    try:
        assert wait_exit(client, 420, logs / "client.log") == 0, tail(logs / "client.log")
        assert wait_exit(drain, 180, logs / "drain.log") == 0, tail(logs / "drain.log")
    finally:
        stop(client)
        stop(drain)

    assert_training_set_matches(out, exp)
    summary = _summary(out)
    assert summary["ok"] == len(exp.samples) and summary["failed"] == {} and summary["skipped"] == 0
    assert summary["rejected"] == dict(Counter(exp.rejects.values()))
    rejects = [json.loads(line) for line in (out / ".hsextract" / "rejects.jsonl").read_text().splitlines()]
    assert {r["index"]: r["reason"] for r in rejects} == exp.rejects
    assert all(r["line"] == r["index"] + 1 and r["detail"] for r in rejects)
    status = client_status(out)
    assert status["state"] == "done" and status["ok"] == len(exp.samples) and status["eta_s"] == 0
    assert status["tokens"] == summary["tokens"] == sum(len(ids) for ids, _ in exp.samples.values())
    # The start-up is said phase by phase, in the summary and the log (hsextract.client.startup).
    assert set(summary["startup_s"]) == {
        "process_and_imports",
        "tokenizer",
        "output_checks",
        "dataset_count",
        "server_wait",
        "server_limit",
        "probe",
    }
    assert summary["startup_s"]["process_and_imports"] > 0 and summary["startup_s"]["probe"] > 0
    assert "start-up: " in (logs / "client.log").read_text()


def _mid_run(out, pid: int, at_least: int, unsent: int) -> bool:
    """The client `pid` is running with at least `at_least` samples done and `unsent` not yet sent."""
    s = client_status(out)
    return (
        s.get("pid") == pid
        and s.get("state") == "running"
        and _done(out) >= at_least
        and s.get("sent", 0) + s.get("skipped", 0) <= s.get("samples_total", 0) - unsent
    )


def test_client_killed_mid_run_and_restarted_loses_and_duplicates_nothing(llama_server, tiny_llama, tmp_path):
    # 150 lines: the status file is up to a second old when it is read, and the run must still be
    # far from its end when the signal lands, even on a fast machine.
    exp = write_mixed_dataset(tmp_path / "data.jsonl", load_tokenizer(tiny_llama), n_lines=150, seed=1)
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    args = extract_args(
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
    )
    drain = start_drain(logs / "drain.log", llama_server.dump_dir, out, tiny_llama)
    client = None
    try:
        # kill -9, then a systemd-style stop (SIGTERM), with requests in flight and records written
        for at_least, sig in ((10, signal.SIGKILL), (25, signal.SIGTERM)):
            client = start_client(logs / "client.log", *args)
            wait_for(
                lambda n=at_least, pid=client.pid: _mid_run(out, pid, n, unsent=60),
                240,
                f"the client running with {at_least} samples done and 60 not yet sent",
                logs / "client.log",
            )
            if sig == signal.SIGKILL:
                stop(client, sig)
            else:
                client.send_signal(sig)
                assert wait_exit(client, 60, logs / "client.log") == 0, "a stopped client exits cleanly in time"
                assert client_status(out)["state"] == "stopped" and client_status(out)["in_flight"] == 0
        assert not (out / ".hsextract" / "client-summary.json").exists()
        client = start_client(logs / "client.log", *args)
        assert wait_exit(client, 420, logs / "client.log") == 0, tail(logs / "client.log")
        assert wait_exit(drain, 180, logs / "drain.log") == 0, tail(logs / "drain.log")
    finally:
        stop(client)
        stop(drain)

    assert_training_set_matches(out, exp)
    summary = _summary(out)
    assert summary["skipped"] > 0 and summary["ok"] + summary["skipped"] == len(exp.samples)
    assert summary["failed"] == {}
    rejects = [json.loads(line) for line in (out / ".hsextract" / "rejects.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in rejects) == sorted(exp.rejects), "each bad line reported exactly once"


def _staged_indices(dump, run_id: str) -> set[int]:
    from hsextract.staging.dumps import iter_complete
    from hsextract.staging.records import parse_rid

    return {p.index for d in iter_complete(dump) if (p := parse_rid(d.name)) and p.run_id == run_id}


def _remove_run(dump, run_id: str) -> None:
    import shutil

    for d in list(dump.iterdir()) + list((dump / "_records").glob("*.json")):
        if f"-{run_id}-" in d.name:
            shutil.rmtree(d) if d.is_dir() else d.unlink()


def test_two_shards_split_the_dataset_without_overlap_and_agree_on_duplicates(llama_server, tiny_llama, tmp_path):
    from hsextract.cli import main
    from hsextract.output.run_id import load_or_create_run_id

    data = tmp_path / "data.jsonl"
    exp = write_mixed_dataset(data, load_tokenizer(tiny_llama), n_lines=12, seed=4, bad=False)
    lines = data.read_bytes().splitlines()
    lines[5] = lines[0]  # the copy is in shard 1/2, the original in shard 0/2
    data.write_bytes(b"\n".join(lines) + b"\n")
    sent: dict[int, set[int]] = {}
    for i in (0, 1):
        out = tmp_path / f"out{i}"
        cfg = tmp_path / f"host{i}.json"  # what the Ansible role writes per host
        cfg.write_text(
            json.dumps(
                {
                    "server": llama_server.url,
                    "dataset": str(data),
                    "model": str(tiny_llama),
                    "dump_dir": str(llama_server.dump_dir),
                    "output": str(out),
                    "shard": f"{i}/2",
                    "format": "specforge",
                }
            )
        )
        run_id = load_or_create_run_id(out)
        try:
            assert main(["extract", "--config", str(cfg), "--max-in-flight", "4"]) == 0
            ok = _summary(out)["ok"]  # the capture finishes a dump's files just after the answer
            wait_for(lambda ok=ok, r=run_id: len(_staged_indices(llama_server.dump_dir, r)) >= ok, 30, "dumps")
            sent[i] = _staged_indices(llama_server.dump_dir, run_id)
        finally:
            _remove_run(llama_server.dump_dir, run_id)
        summary = _summary(out)
        assert summary["samples_total"] == 6
    assert sent[0] == {0, 2, 4, 6, 8, 10}
    assert sent[1] == {1, 3, 7, 9, 11}, "line 6 repeats line 1, which another host sends"
    assert _summary(tmp_path / "out1")["rejected"] == {"duplicate": 1}
    assert sent[0] | sent[1] == set(exp.samples) - {5}


def test_sample_the_server_refuses_is_recorded_failed_and_the_run_goes_on(
    llama_server, tiny_llama, tmp_path, free_port
):
    """The client cuts samples to the longest prompt the server reports; behind a front end that does
    not report it, with a model config that claims a longer context than the server serves, a long
    sample is refused by the server (HTTP 400): it is recorded failed and the others go on."""
    import shutil

    from hsextract.cli import main
    from hsextract.output.run_id import load_or_create_run_id
    from hsextract.staging.records import make_rid, record_path
    from support.recording_proxy import RecordingProxy

    model = tmp_path / "model"
    shutil.copytree(tiny_llama, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    data = tmp_path / "data.jsonl"
    longer_than_context = list(range(4, 200)) * 11  # 2156 tokens; the server's context is 2048
    data.write_text(
        "\n".join(
            json.dumps(x)
            for x in ({"input_ids": [1, 5, 6, 7, 8]}, {"input_ids": longer_than_context}, {"input_ids": [1, 9, 10, 11]})
        )
        + "\n"
    )
    out = tmp_path / "out"
    run_id = load_or_create_run_id(out)
    proxy = RecordingProxy(llama_server.url, free_port(), hidden=("/server_info", "/get_server_info", "/v1/models"))
    proxy.start()
    try:
        assert (
            main(
                [
                    "extract",
                    "--server",
                    proxy.url,
                    "--dataset",
                    str(data),
                    "--model",
                    str(model),
                    "--dump-dir",
                    str(llama_server.dump_dir),
                    "--output",
                    str(out),
                    "--format",
                    "specforge",
                    "--max-attempts",
                    "2",
                ]
            )
            == 0
        )
        summary = _summary(out)
        assert summary["ok"] == 2 and summary["failed"] == {"http_4xx": 1}
        failures = [json.loads(line) for line in (out / ".hsextract" / "failures.jsonl").read_text().splitlines()]
        assert len(failures) == 1 and failures[0]["index"] == 1 and failures[0]["line"] == 2
        assert "HTTP 400" in failures[0]["detail"]
        assert not record_path(llama_server.dump_dir, failures[0]["rid"]).exists(), "no dump will come: no record"
        assert record_path(llama_server.dump_dir, make_rid("hsx", run_id, 0)).exists(), "the drain needs the others'"
    finally:
        proxy.stop()
        _remove_run(llama_server.dump_dir, run_id)


def test_json_array_and_parquet_files_of_a_directory_reach_the_training_set(llama_server, tiny_llama, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = tmp_path / "lines.jsonl"
    exp = write_mixed_dataset(lines, load_tokenizer(tiny_llama), n_lines=24, seed=5, bad=False)
    rows = [json.loads(line) for line in lines.read_bytes().splitlines()]
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "part-0.json").write_text(json.dumps(rows[:12], indent=1))  # ShareGPT's original array form
    keys = sorted({k for r in rows for k in r})  # one schema: every row has every column, null where absent
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows[12:]]), data / "part-1.parquet")
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    drain = start_drain(logs / "drain.log", llama_server.dump_dir, out, tiny_llama)
    client = start_client(
        logs / "client.log",
        *extract_args(llama_server.url, data, tiny_llama, llama_server.dump_dir, out, "--max-in-flight", "4"),
    )
    try:
        assert wait_exit(client, 420, logs / "client.log") == 0, tail(logs / "client.log")
        assert wait_exit(drain, 180, logs / "drain.log") == 0, tail(logs / "drain.log")
    finally:
        stop(client)
        stop(drain)

    assert_training_set_matches(out, exp)  # index = file order, then row: the same as the one JSONL file
    summary = _summary(out)
    assert summary["ok"] == 24 and summary["rejected"] == {} and summary["failed"] == {}
    from hsextract.output.manifest import iter_entries

    assert {e.dataset_index for e in iter_entries(out)} == set(range(24))
