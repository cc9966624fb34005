"""Faults of a drain into a bucket, on a real server: the server stopped and started mid-run, the
drain killed with -9 in the middle of a multipart upload, two drains on one prefix. In each case
every sample ends in the set once, or is still staged; nothing half-written is ever named."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from hsextract.objectstore.segments import read_published
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from support.bucket_sets import assert_set_is_exact, sample_keys, staged_names, store_of, target
from support.drain_proc import drain_until_done, finish_client, hsextract, start
from support.staged_dumps import stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FMT = "speculators"


def _drain_args(weed, bucket: str, prefix: str, creds: Path, dump: Path, work: Path, *extra: str) -> list[str]:
    return [
        "drain",
        "--dump-dir",
        str(dump),
        "--output",
        f"s3://{bucket}/{prefix}",
        "--work-dir",
        str(work),
        "--format",
        FMT,
        "--s3-endpoint",
        weed.endpoint,
        "--s3-credentials",
        str(creds),
        "--poll-interval",
        "0.05",
        "--finalize-idle",
        "0.5",
        "--workers",
        "2",
        *extra,
    ]


def _wait(what: str, check, timeout: float = 120.0, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the drain exited {proc.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _in_manifest(work: Path) -> int:
    return len(list(iter_entries(work)))


def _status(work: Path) -> dict:
    try:
        return json.loads((work / ".hsextract" / "drain-status.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def test_a_server_stopped_mid_run_holds_the_drain_and_loses_nothing(own_weed, tmp_path):
    bucket = own_weed.new_bucket()
    creds = own_weed.credentials_file(tmp_path / "creds")
    dump, work = tmp_path / "dump", tmp_path / "work"
    run = load_or_create_run_id(work)
    for i in range(10):
        stage_sample(dump, run, i, tokens=8 + i)
    log = open(tmp_path / "drain.log", "w")  # noqa: SIM115
    proc = start(*_drain_args(own_weed, bucket, "down", creds, dump, work), stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait("the first 10 samples", lambda: _in_manifest(work) == 10, proc=proc)
        own_weed.stop()
        for i in range(10, 20):
            stage_sample(dump, run, i, tokens=8 + i)
        _wait(
            "the drain to see the server gone",
            lambda: (_status(work).get("objectstore") or {}).get("unreachable_since"),
            proc=proc,
        )
        assert len(staged_names(dump)) == 10, "what could not go up is still staged"
        assert _in_manifest(work) == 10
        _wait(
            "the status file to say so",
            lambda: (
                (_status(work).get("objectstore") or {}).get("unreachable_since") and _status(work).get("lag") == 10
            ),
            proc=proc,
        )
        said = hsextract("status", "--output", f"s3://{bucket}/down", "--work-dir", str(work))
        assert said.returncode == 1 and "has not answered for" in said.stdout, said.stdout
        own_weed.start()
        _wait("the other 10 samples once the server is back", lambda: _in_manifest(work) == 20, proc=proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    out = target(own_weed, bucket, "down", creds)
    assert_set_is_exact(out, set(range(20)))
    assert staged_names(dump) == []
    text = (tmp_path / "drain.log").read_text()
    assert "does not answer" in text and "answers again" in text
    assert own_weed.secret_key not in text


def test_kill_9_mid_multipart_then_resume_names_every_sample_once_and_no_partial_object(
    weed, bucket, credentials, tmp_path
):
    dump, work = tmp_path / "dump", tmp_path / "work"
    run = load_or_create_run_id(work)
    n = 6
    for i in range(n):  # about 12 MiB each: three parts of 5 MiB
        stage_sample(dump, run, i, tokens=1500 + i, hidden_size=1024)
    args = _drain_args(
        weed, bucket, "killed", credentials, dump, work, "--s3-part-size", str(5 << 20), "--uploads", "2"
    )
    client = weed.client()
    proc = start(*args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(
            "a multipart upload in flight",
            lambda: client.list_multipart_uploads(Bucket=bucket, Prefix="killed/").get("Uploads"),
            proc=proc,
        )
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = target(weed, bucket, "killed", credentials)
    named = read_published(store_of(out)).entries
    assert len(named) < n, "the kill landed before the end"
    assert_set_is_exact(out, {e.dataset_index for e in named})  # what is named is whole, even now
    assert len(staged_names(dump)) == n - len(named), "every sample not named is still staged"

    finish_client(work, n)
    drain_until_done(dump, work, FMT, *args[args.index("--work-dir") :], "--output", f"s3://{bucket}/killed", lines=n)
    assert_set_is_exact(out, set(range(n)))
    store = store_of(out)
    from hsextract.formats import get_format

    assert sample_keys(store, get_format(FMT)) == {e.file for e in read_published(store).entries}
    assert staged_names(dump) == []
    # The killed drain's upload was aborted by the next one (its epoch fenced it): no parts linger.
    assert not client.list_multipart_uploads(Bucket=bucket, Prefix="killed/").get("Uploads")


def test_a_second_drain_on_a_prefix_fences_the_first_which_stops_saying_so_and_loses_nothing(
    weed, bucket, credentials, tmp_path
):
    dump_a, work_a, dump_b, work_b = tmp_path / "dump-a", tmp_path / "work-a", tmp_path / "dump-b", tmp_path / "work-b"
    run = load_or_create_run_id(work_a)
    work_b.mkdir()
    shutil.copy(work_a / "run.json", work_b / "run.json")  # the same run: two hosts given one prefix by mistake
    for i in range(5):
        stage_sample(dump_a, run, i)
    log_a = open(tmp_path / "a.log", "w")  # noqa: SIM115
    a = start(*_drain_args(weed, bucket, "shared", credentials, dump_a, work_a), stdout=log_a, stderr=subprocess.STDOUT)
    try:
        _wait("drain A's first samples", lambda: _in_manifest(work_a) == 5, proc=a)
        for i in range(5, 10):
            stage_sample(dump_b, run, i)
        finish_client(work_b, 10)
        b = start(
            *_drain_args(weed, bucket, "shared", credentials, dump_b, work_b),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait("drain B's samples", lambda: _in_manifest(work_b) == 10, proc=b)
            for i in range(10, 15):  # drain A goes on writing: it meets B's segments and stops
                stage_sample(dump_a, run, i)
            assert a.wait(timeout=120) == 5
        finally:
            b.send_signal(signal.SIGTERM)
            b.wait(timeout=60)
    finally:
        if a.poll() is None:
            a.kill()
        log_a.close()
    said = (tmp_path / "a.log").read_text()
    assert "writes this prefix" in said and "nothing is lost" in said
    out = target(weed, bucket, "shared", credentials)
    named = {e.dataset_index for e in read_published(store_of(out)).entries}
    assert_set_is_exact(out, named)
    still_staged = {int(name.rsplit("-", 1)[1]) for name in staged_names(dump_a)}
    assert named | still_staged == set(range(15)), "every sample is in the set or still staged"
    assert not named & still_staged
