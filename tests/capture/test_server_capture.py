"""The capture inside a real SGLang server on CPU writes the right rows for the right requests."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests
import torch
from hsextract import fingerprint
from hsextract.capture.selfcheck import check_dump
from hsextract.capture.writer_child import CHILD_MODULE
from hsextract.staging.dumps import (
    CAPTURE_SERVER_ABORTED,
    DONE_FILE,
    FAILED_FILE,
    STATES_FILE,
    iter_dump_dirs,
    read_done_marker,
    read_failed_marker,
    read_states,
    rid_dir,
)
from support.hf_reference import reference, row_problems
from support.sglang_server import start_server

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.server, pytest.mark.timeout(600)]


def fresh_rid(server, index: int = 0) -> str:
    return f"{server.rid_prefix}-{secrets.token_hex(4)}-{index}"


def wait_done(dump_dir: Path, rid: str, timeout: float = 30) -> Path:
    d = rid_dir(dump_dir, rid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (d / DONE_FILE).exists():
            return d
        time.sleep(0.05)
    present = sorted(p.name for p in dump_dir.iterdir())
    raise AssertionError(f"no complete dump for {rid} in {dump_dir} after {timeout} s; present: {present}")


def prompt(n: int, seed: int) -> list[int]:
    g = __import__("random").Random(seed)
    return [g.randrange(10, 300) for _ in range(n)]


def check_against_hf(server, rid: str, ids: list[int], final_hidden: str | None = None) -> None:
    d = wait_done(server.dump_dir, rid)
    marker = read_done_marker(d)
    states = read_states(d)
    assert states.input_ids.tolist() == ids
    assert states.hidden.shape == (len(ids), marker.num_aux + 1, marker.hidden_size)
    problems = row_problems(
        states.hidden,
        marker.sglang_layers_to_capture,
        marker.architecture,
        reference(server.model_dir, ids),
        final_hidden or marker.final_hidden,
    )
    assert not problems, problems


@pytest.mark.parametrize("server_name", ["llama_server", "dsv3_server"])
def test_chunked_prompt_dump_matches_transformers_hidden_states(request, server_name):
    server = request.getfixturevalue(server_name)
    rid = fresh_rid(server)
    ids = prompt(40, seed=1)  # 3 chunks of the 16-token chunked prefill
    try:
        server.generate(ids, rid=rid)
        check_against_hf(server, rid, ids)
        assert read_done_marker(rid_dir(server.dump_dir, rid)).chunks == [[0, 16], [16, 16], [32, 8]]
    finally:
        shutil.rmtree(rid_dir(server.dump_dir, rid), ignore_errors=True)


def test_concurrent_requests_rows_do_not_mix(llama_server):
    server = llama_server
    run = secrets.token_hex(4)
    prompts = {f"hsx-{run}-{i}": prompt(n, seed=10 + i) for i, n in enumerate((7, 23, 40, 16, 33))}
    try:
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            list(pool.map(lambda item: server.generate(item[1], rid=item[0]), prompts.items()))
        for rid, ids in prompts.items():
            check_against_hf(server, rid, ids)
    finally:
        for rid in prompts:
            shutil.rmtree(rid_dir(server.dump_dir, rid), ignore_errors=True)


def test_batches_of_different_sizes_reusing_pooled_host_buffers_all_complete(llama_server):
    """Single requests of 2, 16 and 8 tokens, one batch each, in that order. With the session
    server's 1 KiB pool granularity and 512 B per row (3 aux layers + final, hidden 64, bf16),
    the first two leave free buffers of 2 and 16 KiB (size classes), and the third must take the
    second of them: the case in which the pool once lost every batch (a tensor comparison in
    list.remove)."""
    server = llama_server
    run = secrets.token_hex(4)
    lengths = (2, 16, 8, 12, 3, 16, 5, 9)
    prompts = {f"hsx-{run}-{i}": prompt(n, seed=40 + i) for i, n in enumerate(lengths)}
    try:
        for rid, ids in prompts.items():
            server.generate(ids, rid=rid)
        for rid, ids in prompts.items():
            d = wait_done(server.dump_dir, rid)
            assert read_states(d).input_ids.tolist() == ids
        assert "could not queue" not in server.log_path.read_text(errors="replace")
    finally:
        for rid in prompts:
            shutil.rmtree(rid_dir(server.dump_dir, rid), ignore_errors=True)


def test_health_checks_and_foreign_requests_are_never_dumped(llama_server):
    server = llama_server
    assert requests.get(f"{server.url}/health_generate", timeout=60).status_code == 200
    server.generate(prompt(12, seed=3))  # no rid: SGLang makes one up
    server.generate(prompt(12, seed=4), rid=f"other-{secrets.token_hex(4)}-0")
    server.generate(prompt(12, seed=5), rid="hsxfoo-1")  # prefix without the separator
    own = fresh_rid(server)
    server.generate(prompt(12, seed=6), rid=own)
    wait_done(server.dump_dir, own)  # the writer works in order: the requests before it are handled
    names = [p.name for p in iter_dump_dirs(server.dump_dir)]  # request directories (not _records, _captures)
    strangers = [n for n in names if not n.startswith(f"{server.rid_prefix}-")]
    assert not strangers, f"dumps of requests the client did not send: {strangers}"


def test_a_rid_that_names_another_place_writes_nothing_outside_the_staging_directory_or_inside(llama_server):
    """Anyone who can POST to the server chooses the rid, and the capture once joined it into its
    paths: these made it create directories and write states and markers wherever they pointed."""
    server = llama_server
    tag = secrets.token_hex(4)
    outside = server.dump_dir.parent / f"escaped-{tag}"
    p = server.rid_prefix
    rids = [
        f"{p}-x/../../escaped-{tag}",
        f"{p}-{tag}-0/../../escaped-{tag}",
        f"{p}-../escaped-{tag}",
        f"{p}-{'/..' * 12}{outside}/pwn",
    ]
    before = {q.name for q in server.dump_dir.iterdir()}
    for i, rid in enumerate(rids):
        server.generate(prompt(20, seed=60 + i), rid=rid)  # answered: the server serves it, uncaptured
    own = fresh_rid(server)
    server.generate(prompt(12, seed=66), rid=own)
    try:
        wait_done(server.dump_dir, own)  # the writer works in order: the requests before it are handled
        assert not outside.exists()
        assert {q.name for q in server.dump_dir.iterdir()} - before == {own}
        log = server.log_path.read_text(errors="replace")
        assert all(f"request id {rid!r} is not captured" in log for rid in rids)
    finally:
        shutil.rmtree(rid_dir(server.dump_dir, own), ignore_errors=True)
        shutil.rmtree(outside, ignore_errors=True)


def test_repeated_prompt_yields_two_complete_dumps(llama_server):
    server = llama_server
    run = secrets.token_hex(4)
    ids = prompt(40, seed=7)
    rids = [f"hsx-{run}-0", f"hsx-{run}-1"]
    try:
        outs = [server.generate(ids, rid=rid) for rid in rids]
        assert [o["meta_info"]["cached_tokens"] for o in outs] == [0, 0]
        for rid in rids:
            check_against_hf(server, rid, ids)
    finally:
        for rid in rids:
            shutil.rmtree(rid_dir(server.dump_dir, rid), ignore_errors=True)


@pytest.mark.parametrize("server_name", ["llama_server", "dsv3_server"])
def test_selfcheck_passes_for_a_real_request(request, server_name):
    server = request.getfixturevalue(server_name)
    rid = fresh_rid(server)
    ids = prompt(10, seed=21)
    try:
        token = server.generate(ids, rid=rid)["output_ids"][0]
        wait_done(server.dump_dir, rid)
        result = check_dump(server.dump_dir, rid, server.model_dir, ids, token)
        assert result.ok, result.reasons
        assert result.details["predicted_token"] == token
    finally:
        shutil.rmtree(rid_dir(server.dump_dir, rid), ignore_errors=True)


def test_selfcheck_fails_with_a_reason_for_a_tampered_dump(llama_server, tmp_path):
    server = llama_server
    rid = fresh_rid(server)
    ids = prompt(10, seed=22)
    try:
        token = server.generate(ids, rid=rid)["output_ids"][0]
        src = wait_done(server.dump_dir, rid)
        copy = tmp_path / "dump"
        shutil.copytree(src, copy / rid)
        # Swap the last position's final hidden state for the first position's: a plausible row,
        # but not the one that produced the server's token.
        layout_path = copy / rid / "states.safetensors"
        states = read_states(layout_path)
        hidden = states.hidden.clone()
        hidden[-1, -1] = -hidden[-1, -1]
        _rewrite_hidden(layout_path, hidden)
        result = check_dump(copy, rid, server.model_dir, ids, token)
        assert not result.ok
        assert any("predicts token" in r for r in result.reasons), result.reasons
        wrong_ids = [*ids[:-1], ids[-1] + 1]
        result = check_dump(server.dump_dir, rid, server.model_dir, wrong_ids, token)
        assert not result.ok and any("token ids differ" in r for r in result.reasons), result.reasons
    finally:
        shutil.rmtree(rid_dir(server.dump_dir, rid), ignore_errors=True)


def _rewrite_hidden(path: Path, hidden) -> None:
    import json
    import struct

    buf = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", buf[:8])
    start = 8 + n + json.loads(buf[8 : 8 + n])["hidden"]["data_offsets"][0]
    raw = hidden.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    buf[start : start + len(raw)] = raw
    path.write_bytes(bytes(buf))


def test_selfcheck_command_prints_json_and_exit_code(llama_server):
    server = llama_server
    rid = fresh_rid(server)
    ids = prompt(10, seed=23)
    try:
        token = server.generate(ids, rid=rid)["output_ids"][0]
        wait_done(server.dump_dir, rid)
        base = [
            sys.executable,
            "-m",
            "hsextract",
            "selfcheck",
            "--dump-dir",
            str(server.dump_dir),
            "--rid",
            rid,
            "--model-path",
            str(server.model_dir),
            "--input-ids",
            ",".join(map(str, ids)),
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO / "files" / "python")}
        good = subprocess.run(
            [*base, "--server-token", str(token)], capture_output=True, text=True, env=env, timeout=120
        )
        assert good.returncode == 0, good.stdout + good.stderr
        assert json.loads(good.stdout)["ok"] is True
        other = (token + 1) % 300
        bad = subprocess.run(
            [*base, "--server-token", str(other)], capture_output=True, text=True, env=env, timeout=120
        )
        verdict = json.loads(bad.stdout)
        assert bad.returncode == 1 and not verdict["ok"] and verdict["reasons"], bad.stdout + bad.stderr
    finally:
        shutil.rmtree(rid_dir(server.dump_dir, rid), ignore_errors=True)


def capture_pre_norm_and_check(server, seed: int):  # -> DoneMarker
    """One 40-token request: its dump matches transformers pre-norm and passes the self-check."""
    rid = fresh_rid(server)
    ids = prompt(40, seed=seed)
    token = server.generate(ids, rid=rid)["output_ids"][0]
    check_against_hf(server, rid, ids, final_hidden="pre_norm")
    result = check_dump(server.dump_dir, rid, server.model_dir, ids, token)
    assert result.ok, result.reasons
    return read_done_marker(rid_dir(server.dump_dir, rid))


def test_pre_norm_final_hidden_and_sglang_convention_layers(llama_prenorm_server):
    marker = capture_pre_norm_and_check(llama_prenorm_server, seed=31)
    assert marker.sglang_layers_to_capture == [1, 3, 6]
    assert marker.eagle_aux_hidden_state_layer_ids == [0, 2, 5]
    assert marker.final_hidden == "pre_norm"


def test_deepseek_pre_norm_final_hidden_matches_transformers(dsv3_server):
    """The suite's DeepSeek-V3 server stores the final state pre-norm (tests/conftest.py says why)."""
    marker = capture_pre_norm_and_check(dsv3_server, seed=37)
    assert marker.final_hidden == "pre_norm"


def test_startup_warmup_is_not_dumped(llama_prenorm_server):
    log = llama_prenorm_server.log_path.read_text(errors="replace")
    names = [p.name for p in iter_dump_dirs(llama_prenorm_server.dump_dir)]
    assert all(n.startswith("hsx-") for n in names), names
    assert "POST /generate" in log or "Prefill batch" in log  # the warmup did run


def test_a_sample_resent_after_its_dump_was_drained_is_captured_again(llama_server):
    server = llama_server
    rid = fresh_rid(server)
    ids = prompt(20, seed=41)
    try:
        server.generate(ids, rid=rid)
        wait_done(server.dump_dir, rid)
        shutil.rmtree(rid_dir(server.dump_dir, rid))  # what the drain does once the sample is durable
        server.generate(ids, rid=rid)
        check_against_hf(server, rid, ids)
    finally:
        shutil.rmtree(rid_dir(server.dump_dir, rid), ignore_errors=True)


def writer_processes(server) -> list[psutil.Process]:
    """The capture's writer processes among the server's processes."""
    root = psutil.Process(server.proc.pid)
    return [p for p in root.children(recursive=True) if CHILD_MODULE in " ".join(p.cmdline())]


def send_concurrently_and_check(server, prompts: dict[str, list[int]], workers: int) -> None:
    """Send ``prompts`` (rid -> token ids) at once; each dump must equal transformers' states and pass
    the self-check against the greedy token the server answered."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        tokens = dict(
            zip(
                prompts,
                pool.map(lambda item: server.generate(item[1], rid=item[0])["output_ids"][0], prompts.items()),
                strict=True,
            )
        )
    for rid, ids in prompts.items():
        check_against_hf(server, rid, ids)
        result = check_dump(server.dump_dir, rid, server.model_dir, ids, tokens[rid])
        assert result.ok, (rid, result.reasons)


def stages_exact_dumps_of_concurrent_prompts(server, seed: int) -> None:
    """Six concurrent prompts, one longer than two chunks: each dump equals transformers' states,
    passes the self-check, and the long one is stitched from its chunks in order."""
    run = secrets.token_hex(4)
    prompts = {f"hsx-{run}-{i}": prompt(n, seed=seed + i) for i, n in enumerate((7, 23, 40, 16, 33, 2))}
    send_concurrently_and_check(server, prompts, workers=len(prompts))
    # The 40-token prompt took several batches (16-token chunked prefill shared with the others).
    chunks = read_done_marker(rid_dir(server.dump_dir, f"hsx-{run}-2")).chunks
    assert len(chunks) >= 3 and [c[0] for c in chunks] == [sum(n for _, n in chunks[:i]) for i in range(len(chunks))]
    assert sum(n for _, n in chunks) == 40, chunks


def test_a_server_writing_from_a_writer_process_stages_exact_dumps(llama_server):
    """The suite's Llama server writes from a child process, the default."""
    server = llama_server
    assert len(writer_processes(server)) == 1, "the scheduler runs one writer process"
    assert "through a writer process" in server.log_path.read_text(errors="replace")
    stages_exact_dumps_of_concurrent_prompts(server, seed=60)


def test_a_server_writing_from_its_own_threads_stages_exact_dumps(llama_prenorm_server):
    """The pre-norm server writes from threads of the scheduler's process (writer_process off)."""
    server = llama_prenorm_server
    assert writer_processes(server) == [], "writer_process off: no writer process"
    assert "through a writer process" not in server.log_path.read_text(errors="replace")
    stages_exact_dumps_of_concurrent_prompts(server, seed=80)


@pytest.fixture(scope="module")
def dp2_server(request, tmp_path_factory, tiny_llama, free_port):
    """A Llama server with two data-parallel replicas (`--dp 2`): two scheduler processes, each with
    its own capture and writer process (SGLang wants one CPU core named per rank on a CPU host)."""
    base = tmp_path_factory.mktemp("dp2")
    handle = start_server(
        tiny_llama,
        port=free_port(),
        dump_dir=base / "dump",
        log_dir=base / "logs",
        extra_args=["--dp", "2"],
        env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1"},
    )
    request.addfinalizer(handle.stop_later)
    return handle


def test_each_data_parallel_replica_writes_its_own_requests_through_its_own_writer_process(dp2_server):
    server = dp2_server
    writers = writer_processes(server)
    assert sorted(w.parent().name() for w in writers) == ["sglang::scheduler_DP0", "sglang::scheduler_DP1"]
    written_before = {w.pid: w.io_counters().write_chars for w in writers}
    run = secrets.token_hex(4)
    prompts = {f"hsx-{run}-{i}": prompt(5 + 3 * i, seed=90 + i) for i in range(16)}
    send_concurrently_and_check(server, prompts, workers=8)
    assert sorted(d.name for d in iter_dump_dirs(server.dump_dir)) == sorted(prompts), "one dump per request"
    smallest = min((rid_dir(server.dump_dir, rid) / STATES_FILE).stat().st_size for rid in prompts)
    # SGLang deals requests to the replicas in turn (its default load balancing without PD):
    # both writer processes wrote dumps.
    wrote = {w.pid: w.io_counters().write_chars - written_before[w.pid] for w in writers}
    assert all(n >= smallest for n in wrote.values()), f"bytes written by each writer process: {wrote}"


def test_a_server_whose_writer_process_is_killed_goes_on_capturing_in_process(dp2_server):
    """Run after the data-parallel test, on its server: one replica's writer process is killed, and
    that scheduler writes from its own threads from then on."""
    server = dp2_server
    child = writer_processes(server)[0]
    child.kill()
    child.wait(timeout=30)
    deadline = time.monotonic() + 60
    while "from now on this process writes" not in server.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, "the scheduler did not notice its writer process's death"
        time.sleep(0.1)
    log = server.log_path.read_text(errors="replace")
    assert f"writer process (pid {child.pid}) died (killed by signal 9 (SIGKILL))" in log
    rid, ids = fresh_rid(server), prompt(40, seed=71)
    server.generate(ids, rid=rid)
    check_against_hf(server, rid, ids)
    assert server.alive()


@pytest.mark.server
@pytest.mark.parametrize("server_name", ["llama_server", "dsv3_server"])
def test_done_json_records_the_token_the_server_returned_and_the_fingerprint_of_its_rows(request, server_name):
    """Across chunks (40 tokens, chunks of 16): the greedy token is the one of the chunk that ends
    the prompt, and the fingerprint taken in the forward pass is the staged file's."""
    server = request.getfixturevalue(server_name)
    rid = fresh_rid(server)
    ids = prompt(40, seed=21)
    try:
        reply = server.generate(ids, rid=rid)
        d = wait_done(server.dump_dir, rid)
        marker = read_done_marker(d)
        states = read_states(d)
        assert marker.greedy_token == reply["output_ids"][0]
        assert marker.fingerprint and marker.fingerprint == fingerprint.of_states(states.hidden, states.input_ids)
    finally:
        shutil.rmtree(rid_dir(server.dump_dir, rid), ignore_errors=True)


@pytest.mark.server
def test_a_request_the_server_refuses_leaves_a_failure_marker_not_a_complete_dump(llama_server):
    """SGLang's scheduler refuses a prompt within the context but over its own input limit (the
    context less a few tokens) with HTTP 400, and runs a 1-token placeholder under the request's rid;
    the capture marks it failed instead of staging a 1-token sample."""
    server = llama_server
    rid = fresh_rid(server)
    too_long = prompt(server_context_len(server) - 2, seed=22)
    try:
        r = requests.post(
            f"{server.url}/generate",
            timeout=120,
            json={"input_ids": too_long, "rid": rid, "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
        )
        assert r.status_code == 400, r.text
        failed = wait_failed(server.dump_dir, rid)
        assert failed.reason == CAPTURE_SERVER_ABORTED
        assert not (rid_dir(server.dump_dir, rid) / DONE_FILE).exists()
    finally:
        shutil.rmtree(rid_dir(server.dump_dir, rid), ignore_errors=True)


def server_context_len(server) -> int:
    return int(
        requests.get(f"{server.url}/get_model_info", timeout=30).json().get("max_context_length")
        or json.loads((Path(server.model_dir) / "config.json").read_text())["max_position_embeddings"]
    )


def wait_failed(dump_dir: Path, rid: str, timeout: float = 30):
    d = rid_dir(dump_dir, rid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        marker = read_failed_marker(d)
        if marker is not None:
            return marker
        time.sleep(0.05)
    raise AssertionError(f"no {FAILED_FILE} for {rid} in {dump_dir} after {timeout} s")
