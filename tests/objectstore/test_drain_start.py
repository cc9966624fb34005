"""A drain's start on a bucket prefix: every start check that can refuse it runs before it fences
the prefix's earlier writers, so a drain refused at start (an operator's mistaken hand-run, a
second host given the prefix with another format) leaves the drain at work there untouched."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from hsextract.objectstore.segments import read_published
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from support.bucket_sets import staged_names, store_of, target
from support.client_run import wait_for
from support.drain_proc import drain_args, finish_client, hsextract, start
from support.staged_dumps import stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _s3(weed, credentials: Path, work: Path) -> list[str]:
    return ["--work-dir", str(work), *weed.cli_args(credentials)]


def test_a_drain_refused_at_start_leaves_the_drain_at_work_on_the_prefix_running(weed, bucket, credentials, tmp_path):
    dump, work = tmp_path / "dump", tmp_path / "work"
    url = f"s3://{bucket}/p"
    run = load_or_create_run_id(work)
    for i in range(6):
        stage_sample(dump, run, i)
    log = open(tmp_path / "live.log", "w")  # noqa: SIM115
    live = start(
        *drain_args(dump, url, "speculators", *_s3(weed, credentials, work), "--exit-when-done"),
        "--poll-interval",
        "0.05",
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: len(list(iter_entries(work))) == 6, 120, "the live drain's first samples", tmp_path / "live.log"
        )
        other_work = tmp_path / "other-work"
        other_work.mkdir()
        shutil.copy(work / "run.json", other_work / "run.json")  # the same run, by hand
        other_dump = tmp_path / "other-dump"
        other_dump.mkdir(mode=0o700)
        refusals = {
            "another format": (other_dump, "specforge", "was written with format 'speculators'"),
            "a staging directory that does not exist": (tmp_path / "no-dump", "speculators", "does not exist"),
        }
        for why, (d, fmt, said) in refusals.items():
            r = hsextract(*drain_args(d, url, fmt, *_s3(weed, credentials, other_work), "--exit-when-done"))
            assert r.returncode == 2, f"{why}: {r.stderr[-2000:]}"
            assert said in r.stderr, f"{why}: {r.stderr[-2000:]}"
        heads = read_published(store_of(target(weed, bucket, "p", credentials))).heads
        assert [h.kind for h in heads].count("epoch") == 1, "no refused drain published an epoch"

        for i in range(6, 10):  # the live drain goes on writing, unfenced
            stage_sample(dump, run, i)
        finish_client(work, 10)
        assert live.wait(timeout=120) == 0, (tmp_path / "live.log").read_text()[-3000:]
    finally:
        if live.poll() is None:
            live.kill()
        log.close()
    named = read_published(store_of(target(weed, bucket, "p", credentials))).entries
    assert sorted(e.dataset_index for e in named) == list(range(10))
    assert staged_names(dump) == []


def test_a_refusal_for_the_prefix_s_configuration_names_the_prefix(weed, bucket, credentials, tmp_path):
    dump, work = tmp_path / "dump", tmp_path / "work"
    url = f"s3://{bucket}/named"
    run = load_or_create_run_id(work)
    stage_sample(dump, run, 0)
    finish_client(work, 1)
    first = hsextract(*drain_args(dump, url, "speculators", *_s3(weed, credentials, work), "--exit-when-done"))
    assert first.returncode == 0, first.stderr[-2000:]
    r = hsextract(*drain_args(dump, url, "specforge", *_s3(weed, credentials, work), "--exit-when-done"))
    assert r.returncode == 2
    error = r.stderr.strip().splitlines()[-1]
    assert f"{url} (work directory {work}) was written with format 'speculators'" in error, error
    assert "a new prefix" in error


def test_a_stop_while_the_endpoint_does_not_answer_ends_the_drain_cleanly(credentials, tmp_path):
    from support.s3_server import free_ports

    dump, work = tmp_path / "dump", tmp_path / "work"
    run = load_or_create_run_id(work)
    for i in range(3):
        stage_sample(dump, run, i)
    finish_client(work, 3)
    nobody = f"http://127.0.0.1:{free_ports(1)[0]}"
    args = drain_args(dump, "s3://sets/d", "speculators", "--work-dir", str(work), "--exit-when-done")
    log = open(tmp_path / "drain.log", "w")  # noqa: SIM115
    proc = start(*args, "--s3-endpoint", nobody, "--s3-credentials", str(credentials), stdout=log, stderr=log)
    try:
        wait_for(lambda: "does not answer" in (tmp_path / "drain.log").read_text(), 60, "the start-up wait")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    said = (tmp_path / "drain.log").read_text()
    assert "Traceback" not in said, said[-3000:]
    assert "drain stopped before its start was complete" in said
    assert len(staged_names(dump)) == 3, "nothing staged was touched"
