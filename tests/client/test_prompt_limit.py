"""Samples are cut to exactly the longest prompt the real server runs: the client asks the server,
``plan`` (which runs before any server) computes the same figure from the model's config.

SGLang 0.5.23 refuses a prompt of ``max_req_input_len`` tokens or more, ``min(context - 1, KV pool
- 1) - 5``: for the tiny Llama's 2048-token context the longest prompt is 2041 tokens, where the
client used to cut to 2047 and had every long sample refused (HTTP 400).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import requests
from hsextract.client.server_limit import server_limit
from hsextract.model_info import read_model_info
from hsextract.prompt_limit import longest_prompt
from support.client_run import env

pytestmark = pytest.mark.server

LONGEST = 2048 - 1 - 5 - 1  # the tiny Llama's context, SGLang's reserve, and its exclusive bound


def _generate(server, n_tokens: int) -> requests.Response:
    body = {"input_ids": [5] * n_tokens, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    return requests.post(f"{server.url}/generate", json=body, timeout=300)


def test_the_limit_computed_from_the_config_is_the_one_the_server_reports_and_holds_to(llama_server, tiny_llama):
    planned = longest_prompt(read_model_info(tiny_llama).context_length)
    reported = server_limit(llama_server.url, model_context=0)
    assert reported is not None and reported.longest == planned == LONGEST
    ok = _generate(llama_server, planned)
    assert ok.status_code == 200 and ok.json()["meta_info"]["prompt_tokens"] == planned
    refused = _generate(llama_server, planned + 1)
    assert refused.status_code == 400 and "exceeds the maximum allowed length" in refused.text


def _write_long_and_short(path) -> None:
    long_reply = " ".join(["paris hello world"] * 1500)
    path.write_text(
        "\n".join(
            json.dumps({"messages": m})
            for m in (
                [{"role": "user", "content": "Tell me about Paris."}, {"role": "assistant", "content": long_reply}],
                [{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "Hello world."}],
            )
        )
        + "\n"
    )


def _remove_run(dump, run_id: str) -> None:
    for d in [*dump.iterdir(), *(dump / "_records").glob("*.json")]:
        if f"-{run_id}-" in d.name:
            shutil.rmtree(d) if d.is_dir() else d.unlink()


@pytest.mark.parametrize("max_tokens", [None, 4000], ids=["default", "more-than-the-server-runs"])
def test_the_client_and_plan_cut_a_long_sample_to_what_the_server_runs(
    llama_server, tiny_llama, tmp_path, caplog, max_tokens
):
    from hsextract.cli import main
    from hsextract.output.run_id import load_or_create_run_id

    data, out = tmp_path / "data.jsonl", tmp_path / "out"
    _write_long_and_short(data)
    limit = [] if max_tokens is None else ["--max-tokens", str(max_tokens)]
    planned = subprocess.run(
        [
            sys.executable,
            "-m",
            "hsextract",
            "plan",
            "--dataset",
            str(data),
            "--model",
            str(tiny_llama),
            "--json",
            str(tmp_path / "plan.json"),
            "--no-progress",
            *limit,
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert planned.returncode == 0, planned.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["overlong"]["max_tokens"] == LONGEST and plan["overlong"]["truncated"] == 1
    assert plan["length_percentiles"]["max"] == LONGEST
    run_id = load_or_create_run_id(out)
    try:
        with caplog.at_level("INFO", logger="hsextract.client"):
            assert (
                main(
                    [
                        "extract",
                        "--server",
                        llama_server.url,
                        "--dataset",
                        str(data),
                        "--model",
                        str(tiny_llama),
                        "--dump-dir",
                        str(llama_server.dump_dir),
                        "--output",
                        str(out),
                        "--format",
                        "specforge",
                        "--max-attempts",
                        "1",
                        *limit,
                    ]
                )
                == 0
            )
    finally:
        _remove_run(llama_server.dump_dir, run_id)
    summary = json.loads((out / ".hsextract" / "client-summary.json").read_text())
    assert summary["ok"] == 2 and summary["failed"] == {} and summary["truncated"] == 1
    assert summary["tokens"] == plan["tokens"]
    if max_tokens is not None:
        said = f"--max-tokens {max_tokens} is more than the server runs ({LONGEST} tokens, the server's"
        assert any(m.startswith(said) for m in caplog.messages), caplog.messages
