"""The drain counts the trained-on tokens as it commits, keeps the counts crash-safe, and writes
every trainer's draft vocabulary files at finalize; ``finalize --verify`` recounts them.

Dumps are staged without a server (the staging contract, tests/drain/staged_dumps.py) with chosen
token ids and loss masks; the expected counts come from those ids and masks alone.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter

import numpy as np
import pytest
import torch
from hsextract.formats import FORMAT_NAMES, get_format
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from hsextract.vocab.checkpoint import checkpoint_path
from hsextract.vocab.tracker import VocabTracker
from support.drain_proc import drain_until_done, hsextract
from support.kill_loop import kill_drain_repeatedly
from vocab.vocab_data import VOCAB, expected_counts, expected_selection, make_samples, stage_all

pytestmark = pytest.mark.slow

SIZES = ["16", "64", "1000"]  # 1000 >= the vocabulary (500): clamped to 500


def _drain(dump, out, fmt, *extra, lines=30):
    return drain_until_done(
        dump, out, fmt, "--draft-vocab-size", *SIZES, "--vocab-size", str(VOCAB), *extra, lines=lines
    )


def _staged(tmp_path, fmt, n=30, seed=0):
    dump, out = tmp_path / "dump", tmp_path / "out"
    samples = make_samples(n, seed)
    stage_all(dump, load_or_create_run_id(out), samples, fmt)
    return dump, out, samples


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_counts_are_of_trained_tokens_only_and_every_trainers_files_are_written(fmt, tmp_path):
    dump, out, samples = _staged(tmp_path, fmt)
    r = _drain(dump, out, fmt)
    want = expected_counts(samples)
    sfx = ".pth" if fmt in ("speculators-v1", "modelopt") else ".pt"
    assert torch.load(out / f"token_freq{sfx}", weights_only=True) == dict(want)
    assert "clamped to 500" in r.stderr and "draft vocabulary size 1000" in r.stderr
    for n in (16, 64, 500):
        order = expected_selection(want, n)
        ids = torch.tensor(sorted(order))
        sf = torch.load(out / f"vocab_mapping/vocab_mapping-{n}{sfx}", weights_only=True)
        assert sf["d2t"].dtype == torch.int64 and torch.equal(sf["d2t"] + torch.arange(n), ids)
        assert sf["t2d"].dtype == torch.bool and sf["t2d"].shape == (VOCAB,)
        assert torch.equal(torch.nonzero(sf["t2d"]).flatten(), ids)
        d2t, t2d = (torch.from_numpy(np.load(out / f"{k}-{n}.npy")) for k in ("d2t", "t2d"))
        assert torch.equal(d2t, sf["d2t"]) and torch.equal(t2d, sf["t2d"])
        mo = torch.load(out / f"draft_vocab_cache/d2t-{n}{sfx}", weights_only=True)
        assert mo.dtype == torch.int64 and (mo + torch.arange(n)).tolist() == order  # frequency order
    assert not (out / "d2t-1000.npy").exists()
    first = torch.load(out / f"vocab_mapping/vocab_mapping{sfx}", weights_only=True)
    assert torch.equal(first["d2t"], torch.load(out / f"vocab_mapping/vocab_mapping-16{sfx}")["d2t"])
    summary = json.loads((out / "draft_vocab.json").read_text())
    assert (summary["samples"], summary["masked_tokens"], summary["vocab_size"]) == (30, sum(want.values()), VOCAB)
    assert [s["size"] for s in summary["sizes"]] == [16, 64, 500] and summary["sizes"][2]["coverage"] == 1.0
    if sfx == ".pth":  # these readers take every file ending in "pt" under the directory as a sample
        fmt_files = {e.file for e in iter_entries(out)}
        assert {p.relative_to(out).as_posix() for p in out.rglob("*") if p.name.endswith("pt")} == fmt_files


def test_padding_takes_the_lowest_ids_never_trained_on(tmp_path):
    dump, out, samples = _staged(tmp_path, "specforge", n=3, seed=4)
    drain_until_done(dump, out, "specforge", "--draft-vocab-size", "64", "--vocab-size", str(VOCAB), lines=3)
    want = expected_counts(samples)
    assert len(want) < 64
    sf = torch.load(out / "vocab_mapping/vocab_mapping.pt", weights_only=True)
    chosen = (sf["d2t"] + torch.arange(64)).tolist()
    assert set(want) <= set(chosen)
    assert sorted(set(chosen) - set(want)) == [t for t in range(64) if t not in want][: 64 - len(want)]


def test_a_restart_recounts_only_the_samples_past_the_checkpoint(tmp_path):
    dump, out, samples = _staged(tmp_path, "specforge", n=12)
    drain_until_done(dump, out, "specforge", "--vocab-size", str(VOCAB), lines=12)
    entries = list(iter_entries(out))
    early = VocabTracker(out, get_format("specforge"), [16])
    early.recover(entries[:5])  # a checkpoint that covers the first 5 samples only...
    early.checkpoint()
    assert json.loads(checkpoint_path(out).read_text())["covered"] == 5
    later = VocabTracker(out, get_format("specforge"), [16])
    assert later.recover(entries) == 7  # ...so the restart reads the files of the other 7
    assert later.counts.to_dict() == dict(expected_counts(samples))


def test_counts_survive_kill_9_at_random_instants_and_always_equal_a_recount(tmp_path):
    """The drain checkpoints after every commit here, so kills land between a manifest append and
    the checkpoint, inside the checkpoint's write, and inside the recovery's recount."""
    dump, hold, out = tmp_path / "dump", tmp_path / "hold", tmp_path / "out"
    samples = make_samples(150, seed=9)
    stage_all(hold, load_or_create_run_id(out), samples, "specforge")
    by_index = {int(p.name.rsplit("-", 1)[1]): p.name for p in hold.iterdir() if p.name.startswith("hsx-")}
    dump.mkdir()
    os.rename(hold / "_records", dump / "_records")
    lagging = 0

    def checkpoint_is_a_prefix_with_its_counts() -> None:
        # After any kill the checkpoint covers a prefix of the manifest, with exactly its counts.
        nonlocal lagging
        entries = list(iter_entries(out))
        if checkpoint_path(out).exists():
            cp = json.loads(checkpoint_path(out).read_text())
            assert cp["covered"] <= len(entries)
            covered = [e.dataset_index for e in entries[: cp["covered"]]]
            assert dict(zip(cp["ids"], cp["counts"], strict=True)) == dict(expected_counts(samples, covered))
            lagging += cp["covered"] < len(entries)

    loop = kill_drain_repeatedly(
        hold=hold,
        dump=dump,
        out=out,
        names=by_index,
        drain_args=[
            "--workers",
            "2",
            "--poll-interval",
            "0.05",
            "--vocab-checkpoint-interval",
            "0",
            "--vocab-size",
            str(VOCAB),
        ],
        per_release=10,
        max_delay_s=0.01,
        rng=random.Random(20261130),
        log=tmp_path / "drain.log",
        after_kill=checkpoint_is_a_prefix_with_its_counts,
    )
    assert loop.kills >= 15 and lagging >= 3, f"{loop.kills} kills, {lagging} left the checkpoint behind the manifest"
    drain_until_done(dump, out, "specforge", "--vocab-size", str(VOCAB), lines=len(samples))
    assert sorted(e.dataset_index for e in iter_entries(out)) == sorted(samples)
    assert torch.load(out / "token_freq.pt", weights_only=True) == dict(expected_counts(samples))
    verified = hsextract("finalize", "--output", str(out), "--verify", "--vocab-size", str(VOCAB))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "equal a recount of the 150 samples" in verified.stdout


def _tamper_checkpoint(out, keep_total: bool) -> int:
    cp = json.loads(checkpoint_path(out).read_text())
    token = cp["ids"][3]
    cp["counts"][3] += 1
    if keep_total:
        cp["masked_tokens"] += 1
    checkpoint_path(out).write_text(json.dumps(cp))
    return token


def test_finalize_verify_detects_a_tampered_count_and_writes_nothing_from_it(tmp_path):
    dump, out, samples = _staged(tmp_path, "specforge", n=10)
    drain_until_done(dump, out, "specforge", "--vocab-size", str(VOCAB), lines=10)
    ok = hsextract("finalize", "--output", str(out), "--verify")
    assert ok.returncode == 0 and "equal a recount of the 10 samples" in ok.stdout, ok.stdout + ok.stderr

    token = _tamper_checkpoint(out, keep_total=True)
    bad = hsextract("finalize", "--output", str(out), "--verify")
    assert bad.returncode == 1, bad.stdout
    assert "BAD draft vocabulary counts differ from a recount" in bad.stdout and f"id {token}:" in bad.stdout
    assert torch.load(out / "token_freq.pt", weights_only=True) == dict(expected_counts(samples))

    checkpoint_path(out).unlink()  # what the message says to do: recount from the files
    assert hsextract("finalize", "--output", str(out)).returncode == 0
    assert hsextract("finalize", "--output", str(out), "--verify").returncode == 0

    _tamper_checkpoint(out, keep_total=False)
    bad = hsextract("finalize", "--output", str(out), "--verify")
    assert bad.returncode == 1 and "checkpoint could not be used" in bad.stdout, bad.stdout


def test_finalize_verify_of_a_read_only_set_checks_every_sample_and_writes_nothing(tmp_path):
    from support.read_only import hsextract_read_only

    dump, out, _ = _staged(tmp_path, "speculators", n=3)
    _drain(dump, out, "speculators", lines=3)
    r = hsextract_read_only([out], "finalize", "--output", str(out), "--verify")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified 3/3 samples" in r.stdout and "equal a recount of the 3 samples' files" in r.stdout
    assert f"{out}: checked, nothing written" in r.stdout and "error" not in r.stderr


def test_finalize_verify_reports_a_torn_manifest_line_and_leaves_the_cut_to_finalize(tmp_path):
    dump, out, _ = _staged(tmp_path, "specforge", n=3)
    _drain(dump, out, "specforge", lines=3)
    manifest = out / "manifest.jsonl"
    torn = manifest.read_bytes() + b'{"output_index": 3, "da'
    manifest.write_bytes(torn)
    r = hsextract("finalize", "--output", str(out), "--verify")
    assert r.returncode == 1 and "ends with a torn line (23 bytes" in r.stdout and "verified 3/3" in r.stdout
    assert manifest.read_bytes() == torn
    assert hsextract("finalize", "--output", str(out)).returncode == 0
    assert manifest.read_bytes() == torn[:-23]


def test_finalize_verify_detects_a_tampered_token_freq_file(tmp_path):
    dump, out, samples = _staged(tmp_path, "specforge", n=10)
    drain_until_done(dump, out, "specforge", "--vocab-size", str(VOCAB), lines=10)
    freq = Counter(torch.load(out / "token_freq.pt", weights_only=True))
    freq[7] += 5
    torch.save(dict(freq), out / "token_freq.pt")
    bad = hsextract("finalize", "--output", str(out), "--verify")
    assert bad.returncode == 1 and "token_freq.pt differs from a recount" in bad.stdout, bad.stdout
    assert hsextract("finalize", "--output", str(out)).returncode == 0  # rewritten from the verified counts
    assert torch.load(out / "token_freq.pt", weights_only=True) == dict(expected_counts(samples))


def test_without_a_vocabulary_size_the_counts_are_kept_and_the_fix_is_named(tmp_path):
    dump, out, samples = _staged(tmp_path, "specforge", n=5)
    r = drain_until_done(dump, out, "specforge", lines=5)
    assert "vocabulary size is unknown" in r.stderr and "--vocab-size V" in r.stderr
    assert torch.load(out / "token_freq.pt", weights_only=True) == dict(expected_counts(samples))
    assert not (out / "vocab_mapping").exists()
    fixed = hsextract("finalize", "--output", str(out), "--vocab-size", str(VOCAB), "--draft-vocab-size", "16")
    assert fixed.returncode == 0 and (out / "vocab_mapping" / "vocab_mapping-16.pt").exists(), fixed.stderr


def test_no_draft_vocab_counts_nothing_and_writes_no_vocabulary_file(tmp_path):
    dump, out, _ = _staged(tmp_path, "speculators", n=5)
    drain_until_done(dump, out, "speculators", "--no-draft-vocab", lines=5)
    assert not checkpoint_path(out).exists() and not (out / "token_freq.pt").exists()
    assert not (out / "draft_vocab.json").exists() and len(list(iter_entries(out))) == 5


def test_a_draft_vocabulary_size_below_one_is_refused_before_anything_runs(tmp_path):
    r = hsextract(
        "drain",
        "--dump-dir",
        str(tmp_path / "d"),
        "--output",
        str(tmp_path / "o"),
        "--format",
        "specforge",
        "--draft-vocab-size",
        "0",
    )
    assert r.returncode == 2 and "--draft-vocab-size 0: give one or more sizes of at least 1" in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_sample_file_that_cannot_be_counted_is_named_and_the_drain_goes_on(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    samples = make_samples(8, seed=3)
    run_id = load_or_create_run_id(out)
    stage_all(dump, run_id, {i: samples[i] for i in range(6)}, "specforge")
    drain_until_done(dump, out, "specforge", "--vocab-size", str(VOCAB), lines=6)
    checkpoint_path(out).unlink()  # the restart must count every sample from its file...
    first = next(iter_entries(out))
    (out / first.file).write_bytes(b"not a torch file")  # ...and one cannot be read
    stage_all(dump, run_id, {i: samples[i] for i in (6, 7)}, "specforge")
    r = drain_until_done(dump, out, "specforge", "--vocab-size", str(VOCAB), lines=8)
    assert "draft vocabulary not counted by this process" in r.stderr
    assert f"cannot count the tokens of sample 0 ({out / first.file})" in r.stderr and "--verify" in r.stderr
    assert sorted(e.dataset_index for e in iter_entries(out)) == list(range(8))
