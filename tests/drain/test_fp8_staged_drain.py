"""Dumps the capture staged in FP8 (its ``precision: fp8``: quantized before the copy to the host) through
the drain: checked as staged and written as staged, into the very set a drain makes of bf16 staging.

The dumps are staged by the capture's own writer (in this process, on CPU tensors: no server), the
same rows once in FP8 and once in bf16; the real server's proof is
tests/drain/test_fp8_capture_server.py.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
from hsextract import fp8
from hsextract.capture.core import BatchRequest, CaptureSettings
from hsextract.capture.sink import WriterOptions
from hsextract.capture.writer import CaptureWriter
from hsextract.drain import validate as v
from hsextract.drain.core import Drainer
from hsextract.drain.prepare import Invalid, Job, Ready, prepare
from hsextract.errors import ConfigError
from hsextract.formats import get_format
from hsextract.layers import resolve
from hsextract.output.layout import run_file_path
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from hsextract.staging.announcements import CaptureAnnouncement, process_start_ticks, write_announcement
from hsextract.staging.dumps import STATES_FILE
from hsextract.staging.records import SampleRecord, make_rid, read_record, write_record
from support.bucket_sets import drain_config
from support.drain_proc import finish_client

pytestmark = pytest.mark.timeout(300)

H = 64
SAMPLES = 5


def _settings(precision: str) -> CaptureSettings:
    return CaptureSettings(
        rid_prefix="hsx",
        layers=resolve([1, 3, 4], 8),
        hidden_size=H,
        final_hidden="pre_norm",  # what the speculators format needs
        architecture="LlamaForCausalLM",
        precision=precision,
    )


def stage_with_the_capture(dump: Path, run_id: str, precision: str, n: int = SAMPLES) -> None:
    """Stage `n` samples (the same rows whatever the precision) through the capture's writer, each with
    its client record and a greedy token for the self-check."""
    dump.mkdir()
    writer = CaptureWriter(dump, _settings(precision), WriterOptions(num_threads=2), device="cpu")
    try:
        for i in range(n):
            tokens = 5 + 11 * i
            g = torch.Generator().manual_seed(i)
            aux = (torch.randn(tokens, 3 * H, generator=g) * 10 ** (i - 2)).to(torch.bfloat16)
            final = torch.randn(tokens, H, generator=g).to(torch.bfloat16)
            ids = torch.randint(0, 1000, (tokens,), generator=g)
            rid = make_rid("hsx", run_id, i)
            mask = [int(t >= tokens // 2) for t in range(tokens)]
            write_record(dump, SampleRecord(rid=rid, index=i, input_ids=ids.tolist(), loss_mask=mask, run_id=run_id))
            req = BatchRequest(rid, 0, 0, tokens, 0)
            writer.submit([req], aux, final, ids, [tokens], tokens=torch.tensor([7]))
        assert writer.flush(30)
    finally:
        writer.close()


def _drain(dump: Path, out: Path, precision: str) -> Drainer:
    finish_client(out, SAMPLES)
    d = Drainer(
        drain_config(dump, out, None, "speculators", precision=precision, max_failure_share=1.0, worker_mode="threads")
    )
    d.run()
    return d


def _same_run(tmp_path: Path) -> tuple[Path, Path, str]:
    """Two outputs of one run id, so that the rids, and every line that names them, are the same."""
    a, b = tmp_path / "out-fp8-staged", tmp_path / "out-bf16-staged"
    run_id = load_or_create_run_id(a)
    b.mkdir()
    run_file_path(b).write_bytes(run_file_path(a).read_bytes())
    return a, b, run_id


def _by_index(out: Path) -> dict:
    return {e.dataset_index: e for e in iter_entries(out)}


def test_fp8_staged_dumps_drain_into_the_same_files_and_lines_as_bf16_staging_quantized_by_the_drain(tmp_path):
    out_fp8, out_bf16, run_id = _same_run(tmp_path)
    stage_with_the_capture(tmp_path / "dump-fp8", run_id, "fp8")
    stage_with_the_capture(tmp_path / "dump-bf16", run_id, "bf16")
    d_fp8, d_bf16 = _drain(tmp_path / "dump-fp8", out_fp8, "fp8"), _drain(tmp_path / "dump-bf16", out_bf16, "fp8")
    for d in (d_fp8, d_bf16):
        assert d.stats.samples == SAMPLES and dict(d.stats.quarantined) == {}
    got, want = _by_index(out_fp8), _by_index(out_bf16)
    assert sorted(got) == sorted(want) == list(range(SAMPLES))
    for i, e in got.items():
        w = want[i]
        assert (e.rid, e.tokens, e.bytes, e.checksum, e.fingerprint) == (
            w.rid,
            w.tokens,
            w.bytes,
            w.checksum,
            w.fingerprint,
        )
        assert (out_fp8 / e.file).read_bytes() == (out_bf16 / w.file).read_bytes()
    assert not list((tmp_path / "dump-fp8").glob("hsx-*")), "every staged dump was drained"


def test_a_bf16_drain_quarantines_an_fp8_staged_dump_saying_the_capture_stages_fp8(tmp_path):
    out = tmp_path / "out"
    run_id = load_or_create_run_id(out)
    stage_with_the_capture(tmp_path / "dump", run_id, "fp8", n=1)
    d = _drain(tmp_path / "dump", out, "bf16")
    assert d.stats.samples == 0 and dict(d.stats.quarantined) == {"precision": 1}
    reason = (out / "quarantine" / make_rid("hsx", run_id, 0) / "reason.txt").read_text()
    assert reason.startswith("precision")
    assert "the capture stages fp8" in reason and "the drain was configured bf16" in reason
    assert (out / "quarantine" / make_rid("hsx", run_id, 0) / STATES_FILE).exists(), "the dump is kept"


def test_an_fp8_staged_row_changed_on_its_way_is_quarantined_as_a_fingerprint_mismatch(tmp_path):
    out = tmp_path / "out"
    run_id = load_or_create_run_id(out)
    stage_with_the_capture(tmp_path / "dump", run_id, "fp8", n=2)
    path = tmp_path / "dump" / make_rid("hsx", run_id, 1) / STATES_FILE
    with open(path, "r+b") as f:  # one FP8 code of a row in the middle of the file's rows
        f.seek(8 + int.from_bytes(f.read(8), "little") + 100)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    d = _drain(tmp_path / "dump", out, "fp8")
    assert d.stats.samples == 1 and dict(d.stats.quarantined) == {"fingerprint_mismatch": 1}


def test_the_self_check_reads_an_fp8_staged_dump_dequantized_as_the_trainer_reads_it(tmp_path):
    out = tmp_path / "out"
    run_id = load_or_create_run_id(out)
    stage_with_the_capture(tmp_path / "fp8", run_id, "fp8", n=3)
    stage_with_the_capture(tmp_path / "bf16", run_id, "bf16", n=3)
    rid = make_rid("hsx", run_id, 2)
    fmt, expected = get_format("speculators"), v.Expected(final_hidden="pre_norm")
    results = {}
    for staged in ("fp8", "bf16"):
        for positions in (0, 4):
            tmp = tmp_path / f"tmp-{staged}-{positions}"
            tmp.mkdir()
            record = read_record(tmp_path / staged, rid)
            job = Job(
                tmp_path / staged / rid, record, expected, "sha256", False, check_positions=positions, precision="fp8"
            )
            results[staged, positions] = prepare(fmt, tmp, job)
            assert isinstance(results[staged, positions], Ready), results[staged, positions]
    checksums = {r.prepared.checksum for r in results.values()}
    fingerprints = {r.prepared.fingerprint for r in results.values()}
    assert len(checksums) == 1 and len(fingerprints) == 1, "streamed or whole, staged FP8 or not: one file"
    fp8_check, bf16_check = results["fp8", 4].check, results["bf16", 4].check
    assert fp8_check is not None and bf16_check is not None and fp8_check.fp8
    assert (fp8_check.data, fp8_check.positions, fp8_check.token) == (bf16_check.data, bf16_check.positions, 7)
    assert fp8_check.dtype == "bfloat16"


def test_a_marker_that_says_bf16_over_an_fp8_file_is_refused_as_a_dtype_mismatch(tmp_path):
    out = tmp_path / "out"
    run_id = load_or_create_run_id(out)
    stage_with_the_capture(tmp_path / "dump", run_id, "fp8", n=1)
    d = tmp_path / "dump" / make_rid("hsx", run_id, 0)
    marker = json.loads((d / "done.json").read_text())
    del marker["precision"]
    (d / "done.json").write_text(json.dumps(marker))
    job = Job(
        d, read_record(tmp_path / "dump", d.name), v.Expected(final_hidden="pre_norm"), "sha256", False, precision="fp8"
    )
    got = prepare(get_format("speculators"), tmp_path, job)
    assert isinstance(got, Invalid) and got.reason == "dtype" and "done marker says bf16 rows" in got.detail


def test_fp8_quantize_of_the_staged_bf16_rows_is_what_the_capture_staged(tmp_path):
    """The two stagings of one sample side by side: the FP8 one holds fp8.quantize of the bf16 one."""
    from hsextract.staging.dumps import read_states

    run_id = "ab12cd34"
    stage_with_the_capture(tmp_path / "fp8", run_id, "fp8", n=2)
    stage_with_the_capture(tmp_path / "bf16", run_id, "bf16", n=2)
    for i in range(2):
        rid = make_rid("hsx", run_id, i)
        a, b = read_states(tmp_path / "fp8" / rid), read_states(tmp_path / "bf16" / rid)
        q, scales = fp8.quantize(b.hidden)
        assert torch.equal(a.hidden.view(torch.uint8), q.view(torch.uint8)) and torch.equal(a.scales, scales)


def _announce_fp8_capture(dump: Path) -> None:
    """A running capture (this process) that stages FP8 rows into `dump`."""
    pid = os.getpid()
    write_announcement(
        dump,
        CaptureAnnouncement(
            dump_dir=str(dump),
            rid_prefix="hsx",
            final_hidden="pre_norm",
            host=socket.gethostname(),
            pid=pid,
            port=30000,
            proc_start=process_start_ticks(pid) or 0,
            precision="fp8",
        ),
    )


def test_a_bf16_drain_refuses_to_start_beside_a_running_capture_that_stages_fp8(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    dump.mkdir(mode=0o700)
    _announce_fp8_capture(dump)
    finish_client(out, 1)
    with pytest.raises(ConfigError, match=r"stages fp8 rows into .*configured bf16 \(--precision bf16\)"):
        Drainer(drain_config(dump, out, None, "speculators", precision="bf16", worker_mode="threads")).run()


def test_an_fp8_drain_starts_beside_a_running_capture_that_stages_fp8(tmp_path):
    out = tmp_path / "out"
    run_id = load_or_create_run_id(out)
    stage_with_the_capture(tmp_path / "dump", run_id, "fp8", n=1)
    _announce_fp8_capture(tmp_path / "dump")
    d = _drain(tmp_path / "dump", out, "fp8")
    assert d.stats.samples == 1
