"""The drain writes a training set into a bucket: each sample an object in the trainer's layout,
confirmed before its staged dump goes, named by immutable manifest segments."""

from __future__ import annotations

import pytest
from hsextract.drain.core import RUN_CHECK_FAILED
from hsextract.formats import get_format
from hsextract.objectstore.segments import SEGMENTS_DIR, read_published
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from support.bucket_sets import (
    drain,
    object_checksum,
    published,
    sample_keys,
    staged_names,
    status_of,
    store_of,
    target,
)
from support.staged_dumps import stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
def test_each_staged_sample_becomes_one_confirmed_object_named_by_a_segment(weed, bucket, credentials, tmp_path, fmt):
    dump, work = tmp_path / "dump", tmp_path / "work"
    out = target(weed, bucket, "runs/r1/host-a", credentials)
    run = load_or_create_run_id(work)
    final = "pre_norm" if fmt == "speculators" else "post_norm"
    staged = {i: stage_sample(dump, run, i, tokens=3 + i, final_hidden=final) for i in range(20)}
    assert drain(dump, work, out, lines=20, fmt=fmt) == 0

    entries = published(out)
    store = store_of(out)
    assert sorted(e.dataset_index for e in entries) == sorted(staged)
    assert [e.output_index for e in entries] == list(range(20))
    for e in entries:
        assert e.file == get_format(fmt).relative_path(e.output_index)
        assert object_checksum(store, e.file, e.checksum.split(":")[0]) == e.checksum
    assert sample_keys(store, get_format(fmt)) == {e.file for e in entries}
    assert staged_names(dump) == []
    # The work directory's manifest is the bucket's, line for line.
    assert [e.to_line() for e in iter_entries(work)] == [e.to_line() for e in entries]


def test_the_dataset_level_files_and_header_are_published_beside_the_samples(weed, bucket, credentials, tmp_path):
    dump, work = tmp_path / "dump", tmp_path / "work"
    out = target(weed, bucket, "set", credentials)
    run = load_or_create_run_id(work)
    for i in range(6):
        stage_sample(dump, run, i, tokens=5 + i)
    assert drain(dump, work, out, lines=6) == 0
    store = store_of(out)
    keys = {store.url.rel(i.key) for i in store.list_objects()}
    assert {"manifest.json", "state.json", "dataset_info.json", ".hsextract/finalized.json"} <= keys
    assert any(k.startswith("data-") and k.endswith(".arrow") for k in keys)
    assert not any(k.startswith(".hsextract/canary/") for k in keys), "the canary is removed"
    assert status_of(work)["finalized_samples"] == 6


def test_a_second_run_of_the_drain_resumes_from_the_segments(weed, bucket, credentials, tmp_path):
    dump, work = tmp_path / "dump", tmp_path / "work"
    out = target(weed, bucket, "resume", credentials)
    run = load_or_create_run_id(work)
    for i in range(5):
        stage_sample(dump, run, i)
    assert drain(dump, work, out, lines=10) == RUN_CHECK_FAILED  # 5 of the 10 lines: the run is not finished
    for i in range(5, 10):
        stage_sample(dump, run, i)
    drain(dump, work, out, lines=10)
    got = read_published(store_of(out))
    assert sorted(e.dataset_index for e in got.entries) == list(range(10))
    assert [h.kind for h in got.heads].count("epoch") == 2, "each drain published its epoch"
    assert {i.key.rsplit("/", 1)[-1] for i in store_of(out).list_objects(SEGMENTS_DIR + "/")} == {
        f"{n:09d}.jsonl" for n in range(len(got.heads))
    }


def test_the_status_names_the_bucket_and_never_a_secret(weed, bucket, credentials, tmp_path):
    dump, work = tmp_path / "dump", tmp_path / "work"
    out = target(weed, bucket, "status", credentials)
    run = load_or_create_run_id(work)
    stage_sample(dump, run, 0)
    drain(dump, work, out, lines=1)
    status = status_of(work)
    assert status["objectstore"]["url"] == f"s3://{bucket}/status"
    for path in work.rglob("*"):
        if path.is_file():
            text = path.read_bytes()
            assert weed.secret_key.encode() not in text, f"{path} holds the secret"
