"""`hsextract pull`: a set in a bucket into a directory each trainer's reader loads as a local
set, every object checked against its manifest line, resumable, whole or a slice."""

from __future__ import annotations

import pytest
import torch
from hsextract import fp8
from hsextract.output.manifest import iter_entries, read_header, verify_entry
from hsextract.output.run_id import load_or_create_run_id
from support.bucket_sets import drain, published, target
from support.drain_proc import hsextract
from support.fleet import VOCAB_SIZE
from support.head_model import write_head_model
from support.reader_check import assert_reader_sees_captured, load_with_reader
from support.staged_dumps import HIDDEN, Staged, stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FINAL = {"specforge": "post_norm", "modelopt": "post_norm", "speculators": "pre_norm", "speculators-v1": "pre_norm"}


def _drained(weed, bucket, credentials, tmp_path, fmt: str, n: int = 7, precision: str = "bf16"):
    dump, work = tmp_path / "dump", tmp_path / "work"
    run = load_or_create_run_id(work)
    staged = {i: stage_sample(dump, run, i, tokens=4 + i, final_hidden=FINAL[fmt]) for i in range(n)}
    out = target(weed, bucket, f"sets/{fmt}", credentials)
    assert drain(dump, work, out, lines=n, fmt=fmt, precision=precision) == 0
    where = weed.cli_args(credentials)
    return out, staged, where


@pytest.mark.readers
@pytest.mark.parametrize("fmt", ["specforge", "speculators", "speculators-v1", "modelopt"])
def test_a_pulled_set_loads_in_the_trainers_reader_with_every_sample_once(
    weed, bucket, credentials, tmp_path, fmt, readers
):
    out, staged, where = _drained(weed, bucket, credentials, tmp_path, fmt)
    dest = tmp_path / "pulled"
    r = hsextract("pull", str(out.url), str(dest), *where)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pulled 7 samples" in r.stdout
    entries = list(iter_entries(dest))
    assert all(verify_entry(dest, e) is None for e in entries)
    loaded = load_with_reader(readers, fmt, dest, num_aux=3, hidden=64)
    assert_reader_sees_captured(fmt, dest, loaded, staged)


def test_a_pull_resumes_with_only_the_samples_it_lacks(weed, bucket, credentials, tmp_path):
    out, _, where = _drained(weed, bucket, credentials, tmp_path, "speculators")
    dest = tmp_path / "pulled"
    assert hsextract("pull", str(out.url), str(dest), *where).returncode == 0
    first = published(out)[2]
    (dest / first.file).unlink()  # as if the pull had stopped before it
    r = hsextract("pull", str(out.url), str(dest), *where)
    assert r.returncode == 0, r.stderr
    assert "1 downloaded now" in r.stdout
    assert verify_entry(dest, next(e for e in iter_entries(dest) if e.file == first.file)) is None


def test_a_damaged_object_is_refused_and_never_kept(weed, bucket, credentials, tmp_path):
    out, _, where = _drained(weed, bucket, credentials, tmp_path, "speculators")
    bad = published(out)[4]
    weed.client().put_object(Bucket=out.url.bucket, Key=out.url.key(bad.file), Body=b"not the sample")
    dest = tmp_path / "pulled"
    r = hsextract("pull", str(out.url), str(dest), *where)
    assert r.returncode != 0
    assert bad.file in r.stderr and "damaged" in r.stderr
    assert not (dest / bad.file).exists()


def test_a_slice_is_renumbered_from_zero_with_its_own_dataset_files(weed, bucket, credentials, tmp_path):
    out, _, where = _drained(weed, bucket, credentials, tmp_path, "speculators")
    dest = tmp_path / "slice"
    r = hsextract("pull", str(out.url), str(dest), "--samples", "2:5", *where)
    assert r.returncode == 0, r.stderr
    entries = list(iter_entries(dest))
    source = published(out)
    assert [e.output_index for e in entries] == [0, 1, 2]
    assert [e.rid for e in entries] == [e.rid for e in source[2:5]]
    assert all(verify_entry(dest, e) is None for e in entries)
    assert (dest / "state.json").exists()


@pytest.mark.readers
def test_an_fp8_set_is_pulled_as_a_specforge_set_the_specforge_reader_loads(
    weed, bucket, credentials, tmp_path, readers
):
    out, staged, where = _drained(weed, bucket, credentials, tmp_path, "speculators", n=5, precision="fp8")
    model = tmp_path / "model"
    write_head_model(model, vocab=VOCAB_SIZE, norm=torch.linspace(0.5, 1.5, HIDDEN))
    dest = tmp_path / "specforge"
    r = hsextract("pull", str(out.url), str(dest), "--format", "specforge", *where)
    assert r.returncode != 0 and "give --to-bf16 with them" in r.stderr, r.stderr
    pull = ("pull", str(out.url), str(dest), "--to-bf16", "--format", "specforge", "--model", str(model), *where)
    r = hsextract(*pull)
    assert r.returncode == 0, r.stderr
    header = read_header(dest)
    assert (header.format, header.final_hidden, header.precision) == ("specforge", "post_norm", "bf16")
    assert (dest / "specforge-train.yaml").is_file() and (dest / "draft_config.json").is_file()
    assert not (dest / "state.json").exists() and not list(dest.glob("d2t*.npy")), "no file of the bucket's format"
    entries = list(iter_entries(dest))
    as_written = {}
    for e in entries:
        held = torch.load(dest / e.file, weights_only=True)
        s = staged[e.dataset_index]
        t = s.hidden.shape[0]
        rows = torch.cat(
            [held["aux_hidden_state"][0].view(t, -1, HIDDEN), held["hidden_state"][0].view(t, 1, HIDDEN)], 1
        )
        assert torch.equal(rows[:, :-1], fp8.dequantize(*fp8.quantize(s.hidden))[:, :-1]), "FP8Transfer's aux rows"
        as_written[e.dataset_index] = Staged(s.rid, s.index, s.input_ids, s.loss_mask, rows)
    loaded = load_with_reader(readers, "specforge", dest, num_aux=3, hidden=HIDDEN)
    assert_reader_sees_captured("specforge", dest, loaded, as_written)
    assert hsextract("finalize", "--output", str(dest), "--verify").returncode == 0

    (dest / entries[2].file).unlink()  # as if the pull had stopped before it
    r = hsextract(*pull)
    assert r.returncode == 0 and "1 downloaded now" in r.stdout, r.stdout + r.stderr
    r = hsextract("pull", str(out.url), str(dest), "--to-bf16", *where)
    assert r.returncode != 0 and "resume it with --format specforge" in r.stderr, r.stderr
