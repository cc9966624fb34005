"""A client started with another ``--shard`` on an output extracted with a wider one keeps the
earlier run's accounts: it is refused before anything changes, so the rejects, failures and
summary of the samples outside its shard are never dropped (what a host re-sharded when the
inventory grows would otherwise do), on the session's real SGLang server and the real drain."""

from __future__ import annotations

import json

import pytest
from hsextract.dataset.chat_template import load_tokenizer
from support.client_run import (
    extract_args,
    start_client,
    start_drain,
    stop,
    tail,
    wait_exit,
    write_mixed_dataset,
)
from support.drain_proc import hsextract

pytestmark = pytest.mark.server


def _files(out) -> dict[str, bytes]:
    state = out / ".hsextract"
    names = ("client-summary.json", "client-status.json", "rejects.jsonl", "failures.jsonl")
    return {n: (state / n).read_bytes() for n in names if (state / n).exists()}


def test_a_client_of_a_narrower_shard_is_refused_and_the_earlier_accounts_stay(llama_server, tiny_llama, tmp_path):
    exp = write_mixed_dataset(tmp_path / "data.jsonl", load_tokenizer(tiny_llama), n_lines=24, seed=5)
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    args = extract_args(llama_server.url, tmp_path / "data.jsonl", tiny_llama, llama_server.dump_dir, out)
    drain = start_drain(logs / "drain.log", llama_server.dump_dir, out, tiny_llama)
    client = None
    try:
        client = start_client(logs / "client.log", *args)
        assert wait_exit(client, 420, logs / "client.log") == 0, tail(logs / "client.log")
        assert wait_exit(drain, 180, logs / "drain.log") == 0, tail(logs / "drain.log")
    finally:
        stop(client)
        stop(drain)
    before = _files(out)
    assert len(before["rejects.jsonl"].splitlines()) == len(exp.rejects) > 0

    narrower = start_client(logs / "narrower.log", *args, "--shard", "1/3")
    assert wait_exit(narrower, 180, logs / "narrower.log") == 2
    said = (logs / "narrower.log").read_text()
    assert "holds the accounts of shard 0/1" in said and "--shard 0/1 as before" in said, tail(logs / "narrower.log")
    after = _files(out)
    assert (
        after["rejects.jsonl"] == before["rejects.jsonl"]
        and after["client-summary.json"] == before["client-summary.json"]
    )
    assert not list((out / ".hsextract").glob("*shard-1-of-3*")), "nothing of the refused shard was written"
    status = hsextract("status", "--output", str(out), "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    accounts = json.loads(status.stdout)["accounts"]
    assert accounts["accepted"] == len(exp.samples) and sum(accounts["rejected"].values()) == len(exp.rejects), accounts
    assert accounts["in_set"] == len(exp.samples)
