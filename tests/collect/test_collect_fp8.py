"""`hsextract collect` of hosts whose sets hold FP8 rows (``--precision fp8``): collected as they
are, verified as they are; or, with ``--to-bf16``, each sample written as the bf16 file the
trainer's reader would have read (hsextract.formats.to_bf16), verified in turn. Precisions are
never mixed in one set."""

from __future__ import annotations

import pytest
import torch
from hsextract import fingerprint, fp8
from hsextract.cli import main
from hsextract.output.manifest import checksum_file, iter_entries, read_header
from safetensors.torch import load_file
from support.fleet import VOCAB_SIZE, make_fleet, three_hosts
from support.head_model import write_head_model
from support.staged_dumps import HIDDEN

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LINES = 12


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Three hosts of one run, each its shard drained in FP8."""
    return make_fleet(tmp_path_factory.mktemp("fp8-fleet"), "speculators", three_hosts(), LINES, precision="fp8")


def test_an_fp8_fleet_is_collected_as_it_is_and_verifies(fleet, collect, tmp_path, capsys):
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), "--final", "--", *fleet.args())
    assert code == 0, err
    header = read_header(into)
    assert header.precision == "fp8"
    by_host = {(e.host, e.host_index): e for e in iter_entries(into)}
    for name, host in fleet.hosts.items():
        for e in iter_entries(host):
            got = by_host[(name, e.output_index)]
            assert (got.checksum, got.bytes, got.fingerprint) == (e.checksum, e.bytes, e.fingerprint)
            assert (into / got.file).read_bytes() == (host / e.file).read_bytes()
    capsys.readouterr()
    assert main(["finalize", "--output", str(into), "--verify", "--draft-vocab-size", "16", "64"]) == 0
    assert "FP8 scales, fingerprint of the stored FP8 rows" in capsys.readouterr().out
    card = (into / "README.md").read_text()
    assert "| precision | fp8: float8_e4m3fn rows" in card and "--hidden-states-backend fp8" in card
    assert main(["status", "--output", str(into), "--max-failure-share", "0.5"]) == 0
    assert "(speculators, fp8 rows)" in capsys.readouterr().out


def test_to_bf16_writes_each_sample_as_the_rows_the_reader_would_have_read_each_verified(
    fleet, collect, tmp_path, capsys
):
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), "--to-bf16", "--final", "--", *fleet.args())
    assert code == 0, err
    header = read_header(into)
    assert (header.precision, header.dtype) == ("bf16", "bfloat16") and "fp8 rows" in header.extra["converted_from"]
    entries = list(iter_entries(into))
    assert sorted(e.dataset_index for e in entries) == sorted(fleet.samples)
    for e in entries:
        staged = fleet.samples[e.dataset_index]
        held = load_file(into / e.file)
        assert list(held) == ["hidden_states", "token_ids", "loss_mask"]  # a plain bf16 file, no scales
        q, scales = fp8.quantize(staged.hidden)
        assert held["hidden_states"].dtype == torch.bfloat16
        assert torch.equal(held["hidden_states"], fp8.dequantize(q, scales)), "FP8Transfer's rows, bit for bit"
        assert torch.equal(held["token_ids"], staged.input_ids) and torch.equal(held["loss_mask"], staged.loss_mask)
        assert (e.bytes, e.checksum) == ((into / e.file).stat().st_size, checksum_file(into / e.file, "xxh3_128"))
        assert e.fingerprint == fingerprint.of_states(held["hidden_states"], staged.input_ids)
        host_entry = next(h for h in iter_entries(fleet.hosts[e.host]) if h.output_index == e.host_index)
        assert e.bytes > 1.6 * host_entry.bytes, "bf16 rows: about twice the FP8 rows (64 wide: 1.7x the file)"
    capsys.readouterr()
    assert main(["finalize", "--output", str(into), "--verify", "--draft-vocab-size", "16", "64"]) == 0
    verified = capsys.readouterr().out
    assert f"verified {len(entries)}/{len(entries)} samples (name, size, checksum, shapes, fingerprint)" in verified
    card = (into / "README.md").read_text()
    assert "| precision | bf16: fp8 rows, dequantized" in card and "--hidden-states-backend" not in card
    before = (into / "manifest.jsonl").read_bytes()
    again, err = collect("--into", str(into), "--to-bf16", "--final", "--", *fleet.args())
    assert again == 0 and (into / "manifest.jsonl").read_bytes() == before, err


def test_precisions_are_never_mixed_and_to_bf16_takes_both(fleet, collect, tmp_path):
    bf16 = make_fleet(tmp_path / "bf16", "speculators", three_hosts(), LINES, dataset=fleet.dataset)
    hosts = [f"a={fleet.hosts['a']}", f"b={bf16.hosts['b']}", f"c={fleet.hosts['c']}"]
    code, err = collect("--into", str(tmp_path / "mixed"), "--", *hosts)
    assert "host b" in err and "precision is 'bf16', expected 'fp8'" in err, err
    assert {e.host for e in iter_entries(tmp_path / "mixed")} == {"a", "c"}
    code, err = collect("--into", str(tmp_path / "bf16-set"), "--to-bf16", "--final", "--", *hosts)
    assert code == 0, err
    assert {e.host for e in iter_entries(tmp_path / "bf16-set")} == {"a", "b", "c"}
    assert read_header(tmp_path / "bf16-set").precision == "bf16"
    code, err = collect("--into", str(tmp_path / "fp8-set"), "--", f"a={fleet.hosts['a']}")
    assert code == 0, err
    code, err = collect("--into", str(tmp_path / "fp8-set"), "--to-bf16", "--", *hosts)
    assert code != 0 and "holds fp8 rows; collect the bf16 set into a new directory" in err, err
    code, err = collect("--into", str(tmp_path / "linked"), "--to-bf16", "--link", "--", *hosts)
    assert code != 0 and "--link and --to-bf16" in err, err
    bf16_hosts = [f"b={bf16.hosts['b']}"]
    code, err = collect(
        "--into", str(tmp_path / "as-specforge"), "--to-bf16", "--format", "specforge", "--", *bf16_hosts
    )
    assert code != 0 and "no host holds FP8 rows" in err, err


def test_to_bf16_into_specforge_gives_its_files_with_the_final_state_through_the_models_norm(fleet, collect, tmp_path):
    model = tmp_path / "model"
    weight = torch.rand(HIDDEN, generator=torch.Generator().manual_seed(3)) + 0.5
    write_head_model(model, vocab=VOCAB_SIZE, norm=weight)
    into = tmp_path / "specforge"
    args = ("--into", str(into), "--to-bf16", "--format", "specforge")
    code, err = collect(*args, "--final", "--", *fleet.args())
    assert code != 0 and "give --model" in err, err
    code, err = collect(*args, "--model", str(model), "--final", "--", *fleet.args())
    assert code == 0, err
    header = read_header(into)
    assert (header.format, header.final_hidden, header.precision) == ("specforge", "post_norm", "bf16")
    assert str(model) in header.extra["converted_from"]
    entries = list(iter_entries(into))
    assert sorted(e.dataset_index for e in entries) == sorted(fleet.samples)
    for e in entries:
        staged = fleet.samples[e.dataset_index]
        held = torch.load(into / e.file, weights_only=True)
        rows = fp8.dequantize(*fp8.quantize(staged.hidden))  # what FP8Transfer reads of the host's file
        t, k = rows.shape[0], rows.shape[1] - 1
        assert e.file.endswith(f"data_{e.output_index}.ckpt")
        assert torch.equal(held["aux_hidden_state"], rows[:, :k].reshape(1, t, k * HIDDEN)), "aux rows bit for bit"
        eps = 1e-6  # write_head_model's rms_norm_eps
        post = torch.nn.functional.rms_norm(rows[:, k].float(), (HIDDEN,), weight.to(torch.bfloat16).float(), eps)
        torch.testing.assert_close(held["hidden_state"][0].float(), post, rtol=2**-7, atol=1e-6)
        assert torch.equal(held["input_ids"], staged.input_ids) and torch.equal(held["loss_mask"], staged.loss_mask)
    assert main(["finalize", "--output", str(into), "--verify", "--draft-vocab-size", "16", "64"]) == 0
    assert (into / "vocab_mapping").is_dir(), "SpecForge's draft vocabulary files, not speculators'"
