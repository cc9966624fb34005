"""`hsextract status`, `finalize --verify` and the run's accounts on a set in a bucket, as on a directory."""

from __future__ import annotations

import json

import pytest
from hsextract.output.run_id import load_or_create_run_id
from support.bucket_sets import drain, published, store_of, target
from support.drain_proc import hsextract
from support.staged_dumps import stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def drained(weed, bucket, credentials, tmp_path):
    """A finished run of 8 samples in the bucket, its work directory, and how to reach it."""
    dump, work = tmp_path / "dump", tmp_path / "work"
    run = load_or_create_run_id(work)
    for i in range(8):
        stage_sample(dump, run, i, tokens=6 + i)
    out = target(weed, bucket, "runs/one", credentials)
    assert drain(dump, work, out, lines=8) == 0
    return out, work, [f"s3://{bucket}/runs/one", *weed.cli_args(credentials)]


def test_status_of_a_bucket_run_shows_its_accounts_from_the_work_directory(drained, weed):
    _, work, where = drained
    r = hsextract("status", "--output", where[0], "--work-dir", str(work), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    status = json.loads(r.stdout)
    assert status["accounts"]["in_set"] == 8 and status["accounts"]["accepted"] == 8
    assert status["drain"]["objectstore"]["url"] == where[0]
    text = hsextract("status", "--output", where[0], "--work-dir", str(work))
    assert where[0] in text.stdout
    assert weed.secret_key not in r.stdout + text.stdout + text.stderr


def test_verify_checks_every_object_against_the_segments(drained):
    where = drained[2]
    r = hsextract("finalize", "--output", *where, "--verify")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified 8/8 samples" in r.stdout
    assert "equal a recount" in r.stdout


def test_verify_names_a_damaged_object_and_tells_of_orphans(drained, weed):
    out, _, where = drained
    entries = published(out)
    client = weed.client()
    damaged = entries[3]
    body = client.get_object(Bucket=out.url.bucket, Key=out.url.key(damaged.file))["Body"].read()
    client.put_object(Bucket=out.url.bucket, Key=out.url.key(damaged.file), Body=body[:-1] + bytes([body[-1] ^ 1]))
    client.put_object(Bucket=out.url.bucket, Key=out.url.key("hidden_states/hs_99.safetensors"), Body=b"x")
    r = hsextract("finalize", "--output", *where, "--verify", "--no-draft-vocab")
    assert r.returncode == 1
    assert f"BAD 3 ({damaged.rid})" in r.stdout and "checksum" in r.stdout
    assert "orphans: 1 object(s)" in r.stdout and "hs_99.safetensors" in r.stdout


def test_finalize_from_another_work_directory_rewrites_and_publishes_the_dataset_files(drained, tmp_path):
    out, _, where = drained
    store = store_of(out)
    store.delete(store.url.key("state.json"))
    r = hsextract("finalize", "--output", *where, "--work-dir", str(tmp_path / "elsewhere"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert store.head(store.url.key("state.json")) is not None
    assert hsextract("finalize", "--output", *where, "--verify").returncode == 0
