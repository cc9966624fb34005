"""The logprob self-check against the real SGLang server on CPU: the captured final rows give the
server's own prompt logprobs; rows of the layer before, or pre-norm rows taken for post-norm ones,
do not, though they pass the greedy check (hsextract.logprob_check).

The post-norm rows taken for pre-norm ones (the other mix-up) cannot be told apart on the suite's
tiny models: their final norm's weights are all 1, so normalising a normalised row gives the same
row again, and the server computes the same logprobs from both.
"""

from __future__ import annotations

import json
import random
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hsextract import server_logprobs
from hsextract.capture.selfcheck import check_dump
from hsextract.greedy_check import GreedyHead
from hsextract.logprob_check import check_final_rows
from hsextract.server_logprobs import DEFAULT_MAX_MEAN_ABS_ERROR
from hsextract.staging.dumps import DONE_FILE, read_done_marker, read_states, write_done_marker
from support.drain_proc import env as hsextract_env
from support.hf_reference import reference
from support.server_dumps import wait_done

pytestmark = [pytest.mark.server, pytest.mark.timeout(600)]


def captured(server, n: int, seed: int) -> tuple[list[int], int, Path]:
    """One prompt of ``n`` tokens through ``server``: its ids, the server's token, its complete dump."""
    g = random.Random(seed)
    ids = [g.randrange(10, 300) for _ in range(n)]
    rid = f"{server.rid_prefix}-{secrets.token_hex(4)}-0"
    token = server.generate(ids, rid=rid)["output_ids"][0]
    return ids, token, wait_done(server.dump_dir, rid)


@pytest.mark.parametrize("server_name", ["llama_server", "llama_prenorm_server", "dsv3_server"])
def test_the_captured_final_rows_give_the_servers_own_prompt_logprobs(request, server_name):
    server = request.getfixturevalue(server_name)
    ids, token, d = captured(server, 40, seed=61)
    try:
        marker, states = read_done_marker(d), read_states(d)
        given = server_logprobs.fetch(server.url, ids)
        greedy, logprobs = check_final_rows(
            GreedyHead(server.model_dir), states.hidden[:, -1], marker.final_hidden, token, given
        )
        assert greedy.ok and logprobs is not None and logprobs.ok, logprobs
        assert logprobs.positions == 40 and logprobs.compared >= 40 * 5
        assert logprobs.mean_abs_error < DEFAULT_MAX_MEAN_ABS_ERROR / 10, logprobs  # measured: 0 to 0.004
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_logprob_request_is_not_captured(llama_server):
    before = {p.name for p in llama_server.dump_dir.iterdir()}
    ids = [random.Random(62).randrange(10, 300) for _ in range(12)]
    given = server_logprobs.fetch(llama_server.url, ids)
    later = captured(llama_server, 12, seed=63)[2]  # the writer works in order: the request before it is handled
    try:
        assert given.positions == 12 and given.next_ids[:-1] == ids[1:]
        assert {p.name for p in llama_server.dump_dir.iterdir()} - before == {later.name}
    finally:
        shutil.rmtree(later, ignore_errors=True)


@pytest.mark.parametrize("n", [10, 40, 100])
def test_rows_of_the_layer_before_fail_the_logprob_check(llama_prenorm_server, n):
    """The residual stream one layer early (the output of layer L-2, from transformers in bf16), stored
    pre-norm: the greedy check passes it at 100 tokens; the logprob check fails it at every length."""
    server = llama_prenorm_server
    ids, token, d = captured(server, n, seed=64)
    try:
        given = server_logprobs.fetch(server.url, ids)
        layer_before = reference(server.model_dir, ids).hidden_states[-2].bfloat16()
        _, logprobs = check_final_rows(GreedyHead(server.model_dir), layer_before, "pre_norm", token, given)
        assert logprobs is not None and not logprobs.ok, logprobs
        assert logprobs.mean_abs_error > 2 * DEFAULT_MAX_MEAN_ABS_ERROR, logprobs  # measured: 0.30 to 0.70
        assert "mean abs error" in logprobs.explain()
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("n", [10, 40, 100])
def test_pre_norm_rows_taken_for_post_norm_ones_pass_the_greedy_check_and_fail_the_logprob_check(
    llama_prenorm_server, n
):
    server = llama_prenorm_server
    ids, token, d = captured(server, n, seed=65)
    try:
        rows = read_states(d).hidden[:, -1]
        given = server_logprobs.fetch(server.url, ids)
        greedy, logprobs = check_final_rows(GreedyHead(server.model_dir), rows, "post_norm", token, given)
        assert greedy.ok, "a scale keeps the argmax: the greedy check cannot see it"
        assert logprobs is not None and not logprobs.ok
        assert logprobs.mean_abs_error > 10 * DEFAULT_MAX_MEAN_ABS_ERROR, logprobs  # measured: 1.9 to 2.3
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_smoke_tests_selfcheck_command_compares_the_probes_logprobs_with_the_servers(llama_server):
    server = llama_server
    ids, token, d = captured(server, 10, seed=66)
    try:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "hsextract",
                "selfcheck",
                "--dump-dir",
                str(server.dump_dir),
                "--rid",
                d.name,
                "--model",
                str(server.model_dir),
                "--input-ids",
                ",".join(map(str, ids)),
                "--server-token",
                str(token),
                "--server",
                server.url,
            ],
            capture_output=True,
            text=True,
            env=hsextract_env(),
            timeout=120,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        numbers = json.loads(r.stdout)["details"]["logprobs"]
        assert numbers["positions"] == 10 and numbers["mean_abs_error"] <= numbers["bound"], numbers
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_smoke_tests_selfcheck_fails_a_probe_whose_pre_norm_rows_are_taken_for_post_norm(
    llama_prenorm_server, tmp_path
):
    server = llama_prenorm_server
    ids, token, d = captured(server, 10, seed=67)
    try:
        copy = tmp_path / "dump"
        shutil.copytree(d, copy / d.name)
        marker = read_done_marker(copy / d.name)
        marker.final_hidden = "post_norm"
        (copy / d.name / DONE_FILE).unlink()
        write_done_marker(copy, marker)
        result = check_dump(copy, d.name, server.model_dir, ids, token, server.url)
        assert not result.ok
        assert [r for r in result.reasons if "logprobs rebuilt" in r], result.reasons
        assert "predicts token" not in " ".join(result.reasons), "the greedy check passes it"
        assert result.details["logprobs"]["mean_abs_error"] > DEFAULT_MAX_MEAN_ABS_ERROR
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_smoke_tests_selfcheck_names_a_server_that_gives_no_logprobs(llama_server, free_port):
    ids, token, d = captured(llama_server, 10, seed=68)
    try:
        url = f"http://127.0.0.1:{free_port()}"
        result = check_dump(llama_server.dump_dir, d.name, llama_server.model_dir, ids, token, url)
        assert not result.ok
        assert [r for r in result.reasons if "the server's logprobs of the probe" in r and url in r], result.reasons
    finally:
        shutil.rmtree(d, ignore_errors=True)
