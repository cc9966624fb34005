"""A set of FP8 rows (``--precision fp8``, the speculators format): the drain checks the staged bf16
rows as for any set, quantizes them (hsextract.fp8), checks what it writes, and records what it wrote.

The released reader's own load of such a set (hs_connectors' FP8Transfer, speculators' ArrowDataset)
is tests/formats/test_fp8_readers.py; the self-check's error on dequantized rows against the real
server is tests/drain/test_fp8_selfcheck.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hsextract import fingerprint, fp8
from hsextract.cli import main
from hsextract.drain import validate as v
from hsextract.drain.core import Drainer
from hsextract.drain.prepare import Job, Ready, prepare
from hsextract.errors import ConfigError
from hsextract.formats import get_format
from hsextract.formats.sample_check import SampleCheck
from hsextract.output.manifest import checksum_file, iter_entries, read_header
from hsextract.output.run_files import read_drain_status
from hsextract.output.run_id import load_or_create_run_id
from hsextract.staging.records import read_record
from safetensors.torch import load_file
from support.bucket_sets import drain_config
from support.drain_proc import finish_client
from support.staged_dumps import Staged, mark_done, restamp_fingerprint, stage_sample

pytestmark = pytest.mark.timeout(300)


def _drain(dump: Path, out: Path, lines: int, precision: str = "fp8", fmt: str = "speculators", **kw) -> Drainer:
    finish_client(out, lines)
    kw.setdefault("worker_mode", "threads")
    d = Drainer(drain_config(dump, out, None, fmt, precision=precision, max_failure_share=1.0, **kw))
    d.run()
    return d


def _stage(tmp_path: Path, n: int, name: str = "", **kw) -> tuple[Path, Path, list[Staged]]:
    dump, out = tmp_path / f"dump{name}", tmp_path / f"out{name}"
    dump.mkdir()
    run = load_or_create_run_id(out)
    return dump, out, [stage_sample(dump, run, i, tokens=3 + 7 * i, **kw) for i in range(n)]


def test_an_fp8_set_holds_the_drains_quantization_of_the_checked_rows_in_the_readers_layout(tmp_path, capsys):
    dump, out, staged = _stage(tmp_path, 5)
    d = _drain(dump, out, 5)
    assert dict(d.stats.quarantined) == {} and d.stats.samples == 5
    header = read_header(out)
    assert (header.format, header.precision, header.dtype) == ("speculators", "fp8", "bfloat16")
    by_index = {s.index: s for s in staged}
    for e in iter_entries(out):
        s = by_index[e.dataset_index]
        path = out / e.file
        held = load_file(path)
        assert list(held) == ["hidden_states", "token_ids", "loss_mask", "hidden_states_scales"]
        q, scales = fp8.quantize(s.hidden)
        assert held["hidden_states"].dtype == torch.float8_e4m3fn and held["hidden_states"].shape == s.hidden.shape
        assert torch.equal(held["hidden_states"].view(torch.uint8), q.view(torch.uint8))
        assert held["hidden_states_scales"].dtype == torch.float32 and torch.equal(held["hidden_states_scales"], scales)
        assert torch.equal(held["token_ids"], s.input_ids) and torch.equal(held["loss_mask"], s.loss_mask)
        # the manifest's line is of the file written, and its fingerprint of the rows as stored
        assert (e.bytes, e.checksum) == (path.stat().st_size, checksum_file(path, header.checksum_algorithm))
        stored = torch.cat([q.reshape(e.tokens, -1).view(torch.uint8), scales.reshape(-1, 1).view(torch.uint8)], 1)
        assert e.fingerprint == fingerprint.of_rows(stored.numpy(), s.input_ids.numpy(), stored.shape[1])
        assert e.fingerprint != fingerprint.of_states(s.hidden, s.input_ids), "not the staged rows' fingerprint"
        assert SampleCheck(get_format("speculators"), header).verify_row(out, e) is None
    assert read_drain_status(out).precision == "fp8"
    capsys.readouterr()
    main(["status", "--output", str(out)])
    assert f"training set   {out} (speculators, fp8 rows)" in capsys.readouterr().out
    assert main(["finalize", "--output", str(out), "--verify"]) == 0
    verified = capsys.readouterr().out
    assert "verified 5/5 samples (name, size, checksum, shapes, FP8 scales, fingerprint of the stored FP8 rows)" in (
        verified
    )


@pytest.mark.slow
def test_the_drains_worker_processes_write_the_fp8_files_its_threads_write(tmp_path):
    """Each process warms up on an FP8 sample of its own and prepares the samples as the threads do."""
    files = {}
    for mode in ("threads", "processes"):
        dump, out, _ = _stage(tmp_path, 4, f"-{mode}", seed=3)
        extra = {"wait_for_worker_processes": True} if mode == "processes" else {}
        d = _drain(dump, out, 4, worker_mode=mode, **extra)
        assert d.stats.samples == 4 and dict(d.stats.quarantined) == {}
        assert (d.cfg.worker_processes > 0) == (mode == "processes")
        files[mode] = {e.dataset_index: (e.checksum, e.fingerprint) for e in iter_entries(out)}
    assert files["processes"] == files["threads"]


def test_fp8_rows_take_half_the_bytes_of_bf16_rows_at_an_8b_width(tmp_path):
    """Measured (the same 3 samples of 3, 10 and 17 tokens, 3 aux layers + the final state, whole
    files: header, rows, scales, token ids and loss mask): at hidden size 4096 (Llama-3.1-8B)
    16,436 bytes a token in FP8 against 32,807 in bf16, 0.5010 (the rows and their scales alone:
    0.50012; the ids, the mask and the header are the same bytes in both); at the tiny models' 64,
    307 against 550, 0.557."""
    ratios = {}
    for hidden in (4096, 64):
        sizes = {}
        for precision in ("bf16", "fp8"):
            dump, out, _ = _stage(tmp_path, 3, f"-{hidden}-{precision}", hidden_size=hidden, seed=1)
            _drain(dump, out, 3, precision)
            entries = list(iter_entries(out))
            tokens = sum(e.tokens for e in entries)
            assert tokens == 30
            sizes[precision] = sum(e.bytes for e in entries) / tokens
        ratios[hidden] = sizes["fp8"] / sizes["bf16"]
    assert ratios[4096] <= 0.51, ratios
    rows_ratio = (4 * 4096 + 4) / (2 * 4 * 4096)
    assert rows_ratio == pytest.approx(0.50012, abs=1e-5)
    assert 0.50 < ratios[64] < 0.57, ratios


def test_a_sample_chosen_for_the_self_check_is_checked_on_the_rows_the_trainer_reads(tmp_path):
    """Its preparation holds the rows whole; the check's rows are the FP8 rows dequantized as
    FP8Transfer does, and the file is byte for byte the streamed one's."""
    dump, _, staged = _stage(tmp_path, 1, done=False)
    s = staged[0]
    mark_done(dump, s, greedy_token=5)  # a token to check the rows against
    record = read_record(dump, s.rid)
    expected = v.Expected(final_hidden="pre_norm")
    fmt = get_format("speculators")
    outcomes = {}
    for positions in (0, 4):
        tmp = tmp_path / f"tmp{positions}"
        tmp.mkdir()
        job = Job(dump / s.rid, record, expected, "sha256", False, check_positions=positions, precision="fp8")
        outcomes[positions] = prepare(fmt, tmp, job)
        assert isinstance(outcomes[positions], Ready), outcomes[positions]
    streamed, whole = outcomes[0], outcomes[4]
    assert streamed.check is None and whole.check is not None
    assert whole.prepared.checksum == streamed.prepared.checksum and whole.prepared.nbytes == streamed.prepared.nbytes
    assert whole.prepared.fingerprint == streamed.prepared.fingerprint
    q, scales = fp8.quantize(s.hidden)
    trainers = fp8.dequantize(q, scales)  # what FP8Transfer hands the trainer
    positions = list(whole.check.positions)
    assert whole.check.fp8 and whole.check.dtype == "bfloat16" and positions == [0, 1, 2]
    rows = whole.check.sample_rows()
    assert torch.equal(rows.rows, trainers[positions, -1]) and not torch.equal(rows.rows, s.hidden[positions, -1])
    assert rows.tie == 2**-3, "the greedy check allows FP8's rounding (hsextract.greedy_check.FP8_REL_TIE)"


def test_the_staged_rows_are_proven_against_the_capture_before_they_are_quantized(tmp_path):
    dump, out, staged = _stage(tmp_path, 3)
    good, moved, nan = staged
    words = moved.hidden.clone()
    words[1, 0, :4] = words[1, 0, :4].flip(0)  # bytes moved within a row: only the staged fingerprint sees it
    _write_rows(dump, moved, words)
    rows = nan.hidden.clone()
    rows[2, 1, 7] = float("nan")  # a NaN the forward pass computed (its fingerprint says so)
    _write_rows(dump, nan, rows)
    restamp_fingerprint(dump / nan.rid)
    d = _drain(dump, out, 3)
    assert dict(d.stats.quarantined) == {"fingerprint_mismatch": 1, "non_finite": 1}
    assert (out / "quarantine" / moved.rid / "reason.txt").read_text().startswith("fingerprint_mismatch")
    assert (out / "quarantine" / nan.rid / "reason.txt").read_text().startswith("non_finite")
    assert [e.dataset_index for e in iter_entries(out)] == [good.index]


def _write_rows(dump: Path, s: Staged, hidden: torch.Tensor) -> None:
    from support.staged_dumps import write_states

    write_states(dump / s.rid / "states.safetensors", hidden, s.input_ids)


@pytest.mark.parametrize(("fmt", "trainer"), [("specforge", "SpecForge"), ("modelopt", "ModelOpt")])
def test_fp8_with_a_format_whose_reader_reads_bf16_only_is_refused_at_the_drains_start(tmp_path, capsys, fmt, trainer):
    dump, out, _ = _stage(tmp_path, 1, final_hidden="post_norm")
    with pytest.raises(ConfigError, match=rf"precision fp8: the {fmt} format's reader \({trainer}\) reads bf16"):
        _drain(dump, out, 1, fmt=fmt)
    assert not list(iter_entries(out)) and (dump / _stage_rid(dump)).is_dir(), "nothing taken from staging"
    capsys.readouterr()
    rc = main(["drain", "--dump-dir", str(dump), "--output", str(out), "--format", fmt, "--precision", "fp8"])
    assert rc != 0
    assert "fp8 is read by: speculators" in capsys.readouterr().err


def _stage_rid(dump: Path) -> str:
    return next(p.name for p in dump.iterdir() if p.name.startswith("hsx-"))


def test_a_set_is_resumed_only_in_the_precision_it_was_written_in(tmp_path):
    dump, out, _ = _stage(tmp_path, 2)
    _drain(dump, out, 2)
    run = load_or_create_run_id(out)
    stage_sample(dump, run, 5)
    with pytest.raises(ConfigError, match=r"was written with precision fp8 \(configured bf16\)"):
        _drain(dump, out, 6, precision="bf16")
    assert read_header(out).precision == "fp8" and len(list(iter_entries(out))) == 2


def test_verify_reads_an_fp8_file_back_and_names_a_scale_or_a_row_that_is_not_its_samples(tmp_path):
    dump, out, _ = _stage(tmp_path, 2)
    _drain(dump, out, 2)
    header = read_header(out)
    check = SampleCheck(get_format("speculators"), header)
    entry = next(e for e in iter_entries(out) if e.tokens > 3)
    path = out / entry.file
    data = bytearray(path.read_bytes())
    meta = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    start = 8 + int.from_bytes(data[:8], "little")
    scales_at = start + meta["hidden_states_scales"]["data_offsets"][0]
    rows_at = start + meta["hidden_states"]["data_offsets"][0]

    def problem_with(edit) -> str:
        changed = bytearray(data)
        edit(changed)
        path.write_bytes(changed)
        try:
            return check.content_problem(path, entry) or ""
        finally:
            path.write_bytes(data)

    assert check.content_problem(path, entry) is None
    nan_scale = problem_with(lambda b: b.__setitem__(slice(scales_at + 4, scales_at + 8), b"\x00\x00\xc0\x7f"))
    assert "its FP8 rows cannot be read back: token 1's scale is nan" in nan_scale, nan_scale
    zero_scale = problem_with(lambda b: b.__setitem__(slice(scales_at, scales_at + 4), bytes(4)))
    assert "token 0's scale is 0.0" in zero_scale, zero_scale
    swapped = problem_with(
        lambda b: b.__setitem__(slice(rows_at, rows_at + 2), bytes(reversed(b[rows_at : rows_at + 2])))
    )
    assert "its rows have fingerprint" in swapped and "another sample's rows" in swapped, swapped
    bf16_header = check.content_problem  # a bf16 set's check of the FP8 file: its shapes are not the set's
    header.precision = "bf16"
    assert "hidden_states_scales" in (bf16_header(path, entry) or "")
