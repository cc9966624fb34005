"""`hsextract collect` of a two-host fleet whose drains wrote into one bucket: the hosts' prefixes
merged in place by server-side copies, in dataset-index order, every sample once, no sample bytes
through the controller; the orphans the hosts hold are reported, never collected."""

from __future__ import annotations

import argparse

import pytest
from hsextract.objectstore import store as store_mod
from hsextract.output.manifest import iter_entries, verify_entry
from support.bucket_sets import collect_in_place_args, drain_fleet, published, store_of, target
from support.drain_proc import hsextract

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _fleet(weed, bucket, credentials, tmp_path, **kw):
    """Hosts a and b of one run, each its shard (even / odd indices) drained into its own prefix."""
    return drain_fleet(weed, bucket, credentials, tmp_path, **kw)


def test_two_hosts_prefixes_are_merged_in_place_in_dataset_order_every_sample_once(weed, bucket, credentials, tmp_path):
    staged = _fleet(weed, bucket, credentials, tmp_path)
    weed.client().put_object(Bucket=bucket, Key="run/b/hidden_states/hs_50.safetensors", Body=b"an orphan")
    r = hsextract(*collect_in_place_args(weed, bucket, credentials, tmp_path))
    assert r.returncode == 0, r.stderr
    assert "orphans: host b" in r.stderr and "hs_50.safetensors" in r.stderr
    into = target(weed, bucket, "run/set", credentials)
    entries = published(into)
    assert [e.dataset_index for e in entries] == sorted(staged)
    assert [e.output_index for e in entries] == list(range(len(staged)))
    assert {e.host for e in entries} == {"a", "b"}
    # The collected set, pulled and checked against its manifest, is the hosts' samples.
    dest = tmp_path / "pulled"
    assert hsextract("pull", str(into.url), str(dest), *weed.cli_args(credentials)).returncode == 0
    assert all(verify_entry(dest, e) is None for e in iter_entries(dest))
    verify = hsextract(
        "finalize",
        "--output",
        str(into.url),
        "--s3-endpoint",
        weed.endpoint,
        "--s3-credentials",
        str(credentials),
        "--verify",
    )
    assert verify.returncode == 0, verify.stdout
    # Again: nothing new, nothing copied twice.
    again = hsextract(*collect_in_place_args(weed, bucket, credentials, tmp_path))
    assert again.returncode == 0 and '"collected_now": 0' in again.stdout
    assert len(published(into)) == len(staged)


def test_no_sample_bytes_pass_through_the_collecting_process(weed, bucket, credentials, tmp_path, monkeypatch):
    staged = _fleet(weed, bucket, credentials, tmp_path, hidden_size=1024, tokens=200)  # about 1.6 MB a sample
    fetched = []
    real_get, real_download = store_mod.ObjectStore.get_bytes, store_mod.ObjectStore.download

    def get_bytes(self, key, first=None, last=None):
        data = real_get(self, key, first, last)
        fetched.append(len(data or b""))
        return data

    def download(self, key, dest, algorithm="", chunk=8 << 20):
        got = real_download(self, key, dest, algorithm, chunk)
        fetched.append(got[0])
        return got

    monkeypatch.setattr(store_mod.ObjectStore, "get_bytes", get_bytes)
    monkeypatch.setattr(store_mod.ObjectStore, "download", download)
    from hsextract.collect import command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(collect_in_place_args(weed, bucket, credentials, tmp_path)[1:])
    assert command.run(args) == 0
    sample_bytes = sum(e.bytes for e in published(target(weed, bucket, "run/set", credentials)))
    assert len(published(target(weed, bucket, "run/set", credentials))) == len(staged)
    # What the process read: manifests, headers, counts, and each sample's token ids (ranged reads).
    assert sum(fetched) < sample_bytes / 20, (sum(fetched), sample_bytes)
    assert store_of(target(weed, bucket, "run/set", credentials)).head("run/set/state.json") is not None
