"""A whole extraction into a bucket: the real SGLang server with the capture on, the client and the
drain as their units run them, the set written to a real S3 server; pulled back, it holds exactly
the dataset's valid samples, as a directory's run would."""

from __future__ import annotations

import sys

import pytest
from hsextract.dataset.chat_template import load_tokenizer
from support.client_run import (
    assert_training_set_matches,
    extract_args,
    start_client,
    stop,
    tail,
    wait_exit,
    write_mixed_dataset,
)
from support.drain_proc import hsextract

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]


def test_a_whole_extraction_lands_in_the_bucket_with_exactly_the_valid_samples(
    llama_server, tiny_llama, weed, bucket, credentials, tmp_path
):
    exp = write_mixed_dataset(tmp_path / "data.jsonl", load_tokenizer(tiny_llama), n_lines=40)
    url, work, logs = f"s3://{bucket}/runs/e2e", tmp_path / "work", tmp_path / "logs"
    logs.mkdir()
    store = ["--work-dir", str(work), *weed.cli_args(credentials)]
    drain = start_client(
        logs / "drain.log",
        sys.executable,
        "-m",
        "hsextract",
        "drain",
        "--dump-dir",
        str(llama_server.dump_dir),
        "--output",
        url,
        "--format",
        "specforge",
        "--model",
        str(tiny_llama),
        "--exit-when-done",
        "--poll-interval",
        "0.2",
        "--finalize-idle",
        "3600",
        *store,
    )
    client = start_client(
        logs / "client.log",
        *extract_args(
            llama_server.url,
            tmp_path / "data.jsonl",
            tiny_llama,
            llama_server.dump_dir,
            url,
            "--work-dir",
            str(work),
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
    status = hsextract("status", "--output", url, "--work-dir", str(work))
    assert status.returncode == 0, status.stdout + status.stderr
    pulled = tmp_path / "pulled"
    r = hsextract("pull", url, str(pulled), *weed.cli_args(credentials))
    assert r.returncode == 0, r.stderr
    assert_training_set_matches(pulled, exp)
    assert weed.secret_key not in (logs / "drain.log").read_text() + status.stdout
