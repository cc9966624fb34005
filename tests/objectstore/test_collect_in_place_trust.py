"""`hsextract collect --into s3://...` trusts a host's prefix no more than the directory collect
trusts a host's directory: a host object that is missing, replaced since its drain wrote it, or
another sample's, is that sample's failure (listed with its reason, exit 3), never an abort and
never a sample in the set; the other samples are collected, and the hosts' accounts add up."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hsextract.formats import get_format
from hsextract.objectstore.segments import SEGMENTS_DIR, read_published, segment_rel
from support.bucket_sets import drain_fleet, published, sample_keys, store_of, target
from support.drain_proc import hsextract

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _where(weed, credentials) -> list[str]:
    return weed.cli_args(credentials)


def _collect(weed, bucket, credentials, tmp_path):
    r = hsextract(
        "collect",
        "--into",
        f"s3://{bucket}/run/set",
        "--work-dir",
        str(tmp_path / "set-work"),
        *_where(weed, credentials),
        "--",
        f"a=s3://{bucket}/run/a",
        f"b=s3://{bucket}/run/b",
    )
    return r, json.loads(r.stdout.strip().splitlines()[-1])


def _verify(weed, bucket, credentials, prefix: str = "run/set"):
    return hsextract("finalize", "--output", f"s3://{bucket}/{prefix}", "--verify", *_where(weed, credentials))


def _flip_a_byte(data: bytes) -> bytes:
    changed = bytearray(data)
    changed[len(changed) // 2] ^= 1
    return bytes(changed)


def _assert_the_set_is_the_rest(weed, bucket, credentials, staged, lost: set[int]) -> None:
    """The collected set holds every staged sample but `lost`, each once, verified byte for byte,
    with no object of its own that no segment names."""
    into = target(weed, bucket, "run/set", credentials)
    entries = published(into)
    assert sorted(e.dataset_index for e in entries) == sorted(set(staged) - lost)
    assert sample_keys(store_of(into), get_format("speculators")) == {e.file for e in entries}, "no orphan copies"
    v = _verify(weed, bucket, credentials)
    assert v.returncode == 0, v.stdout


def test_a_missing_host_object_fails_its_sample_and_the_others_are_collected(weed, bucket, credentials, tmp_path):
    staged = drain_fleet(weed, bucket, credentials, tmp_path)
    host_a = published(target(weed, bucket, "run/a", credentials))
    gone = host_a[3]
    weed.client().delete_object(Bucket=bucket, Key=f"run/a/{gone.file}")
    for attempt in (1, 2):  # and again: the same sample fails, nothing is copied twice
        r, said = _collect(weed, bucket, credentials, tmp_path)
        assert r.returncode == 3, r.stderr
        assert said["failed"] == 1 and said["samples"] == len(staged) - 1, said
        assert f"FAILED a sample 3 (dataset index {gone.dataset_index}): collect_missing" in r.stderr
        assert "host a: 6 in its set = 5 in the collected set + 1 failed + 0 duplicate(s)" in r.stderr, r.stderr
        assert "host b: 6 in its set = 6 in the collected set + 0 failed" in r.stderr
        assert said["collected_now"] == (len(staged) - 1 if attempt == 1 else 0)
    _assert_the_set_is_the_rest(weed, bucket, credentials, staged, {gone.dataset_index})
    listed = weed.client().get_object(Bucket=bucket, Key="run/set/.hsextract/collect-failures.jsonl")["Body"].read()
    assert [json.loads(line)["rid"] for line in listed.splitlines()] == [gone.rid]


def _replaced_without_metadata(client, bucket, key, entries):
    client.put_object(
        Bucket=bucket, Key=key, Body=_flip_a_byte(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    )


def _replaced_with_its_metadata(client, bucket, key, entries):
    obj = client.get_object(Bucket=bucket, Key=key)
    client.put_object(Bucket=bucket, Key=key, Body=_flip_a_byte(obj["Body"].read()), Metadata=obj["Metadata"])


def _another_samples_object(client, bucket, key, entries):
    other = f"run/a/{entries[4].file}"
    client.copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": other})


@pytest.mark.parametrize(
    ("replace", "reason"),
    [
        (_replaced_without_metadata, "collect_no_metadata"),
        (_replaced_with_its_metadata, "collect_checksum"),
        (_another_samples_object, "collect_wrong_sample"),
    ],
    ids=["bytes-changed", "bytes-changed-metadata-kept", "another-samples-object"],
)
def test_a_host_object_that_is_not_its_lines_sample_is_not_collected(
    weed, bucket, credentials, tmp_path, replace, reason
):
    staged = drain_fleet(weed, bucket, credentials, tmp_path)
    host_a = published(target(weed, bucket, "run/a", credentials))
    bad = host_a[2]
    replace(weed.client(), bucket, f"run/a/{bad.file}", host_a)
    r, said = _collect(weed, bucket, credentials, tmp_path)
    assert r.returncode == 3, r.stderr
    assert f"FAILED a sample 2 (dataset index {bad.dataset_index}): {reason}" in r.stderr, r.stderr
    assert said["failed"] == 1
    _assert_the_set_is_the_rest(weed, bucket, credentials, staged, {bad.dataset_index})


def test_a_consistent_lie_in_a_hosts_segment_is_caught_by_the_twin_it_leaves(weed, bucket, credentials, tmp_path):
    """Line 1 of host a edited to name sample 2's bytes (its size, checksum, tokens, fingerprint,
    ETag), sample 2's object copied under line 1's key with line 1's manifest line as metadata:
    every check of the row against its object passes, and only the two rows' one checksum tells."""
    staged = drain_fleet(weed, bucket, credentials, tmp_path)
    client = weed.client()
    store = store_of(target(weed, bucket, "run/a", credentials))
    pub = read_published(store)
    liar, true = pub.entries[1], pub.entries[2]
    for field in ("bytes", "checksum", "tokens", "fingerprint", "etag"):
        setattr(liar, field, getattr(true, field))
    seg = next(n for n, _ in enumerate(pub.heads) if _names(store, n, liar.rid))
    body = store.get_bytes(store.url.key(segment_rel(seg))) or b""
    lines = body.split(b"\n")
    lines = [liar.to_line().rstrip(b"\n") if _rid(liar.rid) in line else line for line in lines]
    client.put_object(Bucket=bucket, Key=store.url.key(segment_rel(seg)), Body=b"\n".join(lines))
    meta = client.head_object(Bucket=bucket, Key=f"run/a/{liar.file}")["Metadata"]
    meta["hsextract-entry"] = dataclasses.replace(liar, etag="").to_line().decode().strip()  # as the drain stores it
    client.copy_object(
        Bucket=bucket,
        Key=f"run/a/{liar.file}",
        CopySource={"Bucket": bucket, "Key": f"run/a/{true.file}"},
        Metadata=meta,
        MetadataDirective="REPLACE",
    )
    host_verify = _verify(weed, bucket, credentials, "run/a")
    assert host_verify.returncode == 1
    assert "BAD 1" in host_verify.stdout and "BAD 2" in host_verify.stdout and "same bytes" in host_verify.stdout
    r, said = _collect(weed, bucket, credentials, tmp_path)
    assert r.returncode == 3 and said["failed"] == 2, r.stderr
    assert r.stderr.count(": collect_same_bytes: ") == 2, r.stderr
    _assert_the_set_is_the_rest(weed, bucket, credentials, staged, {liar.dataset_index, true.dataset_index})


def _names(store, n: int, rid: str) -> bool:
    return _rid(rid) in (store.get_bytes(store.url.key(f"{SEGMENTS_DIR}/{n:09d}.jsonl")) or b"")


def _rid(rid: str) -> bytes:
    return f'"rid":"{rid}"'.encode()


def test_verify_of_a_set_with_a_missing_object_says_so_once_and_leaves_the_vocabulary_unchecked(
    weed, bucket, credentials, tmp_path
):
    drain_fleet(weed, bucket, credentials, tmp_path, hosts=("a",), n=5)
    gone = published(target(weed, bucket, "run/a", credentials))[3]
    weed.client().delete_object(Bucket=bucket, Key=f"run/a/{gone.file}")
    v = _verify(weed, bucket, credentials, "run/a")
    assert v.returncode == 1
    assert f"BAD 3 ({gone.rid}): s3://{bucket}/run/a/{gone.file}: missing" in v.stdout
    assert "draft vocabulary: not checked, 1 sample object(s) are BAD" in v.stdout
    assert "error" not in v.stderr, v.stderr
