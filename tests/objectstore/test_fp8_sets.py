"""A set of FP8 rows (``--precision fp8``) in a bucket: verified from its objects, pulled as it is or,
with ``pull --to-bf16``, as the bf16 files the trainer's reader would have read (each verified, the
pull resumable), and collected in place like any set (``--to-bf16`` is the pull's there)."""

from __future__ import annotations

import json

import pytest
import torch
from hsextract import fp8
from hsextract.output.manifest import iter_entries, read_header, verify_entry
from hsextract.output.run_id import load_or_create_run_id
from safetensors.torch import load_file
from support.bucket_sets import collect_in_place_args, drain, drain_fleet, published, target
from support.drain_proc import hsextract
from support.staged_dumps import stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_an_fp8_set_verifies_in_its_bucket_and_is_pulled_as_it_is_or_as_bf16_files(weed, bucket, credentials, tmp_path):
    dump, work = tmp_path / "dump", tmp_path / "work"
    run = load_or_create_run_id(work)
    staged = {i: stage_sample(dump, run, i, tokens=4 + i) for i in range(6)}
    out = target(weed, bucket, "sets/fp8", credentials)
    assert drain(dump, work, out, lines=6, precision="fp8") == 0
    where = weed.cli_args(credentials)
    verified = hsextract("finalize", "--output", str(out.url), "--verify", *where)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    as_is = tmp_path / "pulled"
    r = hsextract("pull", str(out.url), str(as_is), *where)
    assert r.returncode == 0, r.stderr
    assert read_header(as_is).precision == "fp8"
    assert [(e.checksum, e.bytes) for e in iter_entries(as_is)] == [(e.checksum, e.bytes) for e in published(out)]
    assert hsextract("finalize", "--output", str(as_is), "--verify").returncode == 0

    bf16 = tmp_path / "pulled-bf16"
    r = hsextract("pull", str(out.url), str(bf16), "--to-bf16", *where)
    assert r.returncode == 0, r.stderr
    header = read_header(bf16)
    assert (header.precision, header.dtype) == ("bf16", "bfloat16") and "converted_from" in header.extra
    entries = list(iter_entries(bf16))
    for e in entries:
        s = staged[e.dataset_index]
        held = load_file(bf16 / e.file)
        assert list(held) == ["hidden_states", "token_ids", "loss_mask"]
        assert torch.equal(held["hidden_states"], fp8.dequantize(*fp8.quantize(s.hidden)))
        assert verify_entry(bf16, e) is None
    check = hsextract("finalize", "--output", str(bf16), "--verify")
    assert check.returncode == 0 and "fingerprint)" in check.stdout, check.stdout
    journal = [json.loads(line) for line in (bf16 / ".hsextract" / "pulled.jsonl").read_text().splitlines()]
    assert {row["checksum"] for row in journal} == {e.checksum for e in published(out)}, "the objects' checksums"
    assert {row["bf16"]["checksum"] for row in journal} == {e.checksum for e in entries}, "and the bf16 files'"

    (bf16 / entries[3].file).unlink()  # as if the pull had stopped before it
    r = hsextract("pull", str(out.url), str(bf16), "--to-bf16", *where)
    assert r.returncode == 0 and "1 downloaded now" in r.stdout, r.stdout + r.stderr
    assert list(iter_entries(bf16)) == entries and verify_entry(bf16, entries[3]) is None
    r = hsextract("pull", str(out.url), str(bf16), *where)
    assert r.returncode != 0 and "resume it with --to-bf16" in r.stderr, r.stderr


def test_an_fp8_fleet_is_collected_in_place_and_to_bf16_is_left_to_the_pull(weed, bucket, credentials, tmp_path):
    staged = drain_fleet(weed, bucket, credentials, tmp_path, n=8, precision="fp8")
    refused = hsextract(*collect_in_place_args(weed, bucket, credentials, tmp_path, "--to-bf16"))
    assert refused.returncode != 0 and "pull the collected set with `hsextract pull --to-bf16`" in refused.stderr
    r = hsextract(*collect_in_place_args(weed, bucket, credentials, tmp_path))
    assert r.returncode == 0, r.stderr
    into = target(weed, bucket, "run/set", credentials)
    assert [e.dataset_index for e in published(into)] == sorted(staged)
    where = weed.cli_args(credentials)
    verified = hsextract("finalize", "--output", str(into.url), "--verify", *where)
    assert verified.returncode == 0, verified.stdout
    dest = tmp_path / "pulled"
    assert hsextract("pull", str(into.url), str(dest), *where).returncode == 0
    assert read_header(dest).precision == "fp8"
