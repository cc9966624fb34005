"""What the drain makes of records and dumps that other versions and other runs leave in staging.

* Older clients wrote ``--output`` into each record as it was typed: a relative path, which the
  drain compared with its resolved one and refused, so no drain could ever take those dumps.
* A client whose ``--dump-dir`` is not its server's gets its start-up probe staged in the
  server's real staging directory, where it waited among another run's dumps forever, and every
  drain there warned about it at each start.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from hsextract.staging.dumps import DoneMarker, write_done_marker
from hsextract.staging.records import make_probe_rid, read_record, write_record
from support.drain_proc import drain_until_done
from support.staged_dumps import stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _with_output(dump: Path, rid: str, output: str) -> None:
    record = read_record(dump, rid)
    assert record is not None
    record.output = output
    write_record(dump, record)


def test_a_record_an_older_client_wrote_with_a_relative_output_is_drained(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "runs" / "out"
    run = load_or_create_run_id(out)
    for i, typed in enumerate(["out", "./runs/out", f"../{tmp_path.name}/runs/out"]):  # typed in three places
        _with_output(dump, stage_sample(dump, run, i).rid, typed)
    drain_until_done(dump, out, "speculators", lines=3)
    assert sorted(e.dataset_index for e in iter_entries(out)) == [0, 1, 2]


@pytest.mark.parametrize("named", ["other/out", "/elsewhere/out"])
def test_a_record_naming_another_output_directory_stops_the_drain(tmp_path, named):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    _with_output(dump, stage_sample(dump, run, 0).rid, named)
    r = drain_until_done(dump, out, "speculators", lines=1, expect_rc=2)
    assert f"names the output directory {named}, but this drain writes {out}" in r.stderr, r.stderr
    assert not list(iter_entries(out))


def _stage_probe(dump: Path, run_id: str) -> str:
    rid = make_probe_rid("hsx", run_id)
    (dump / rid).mkdir(parents=True)
    (dump / rid / "states.safetensors").write_bytes(b"")
    write_done_marker(
        dump,
        DoneMarker(
            rid=rid,
            prompt_len=12,
            num_aux=3,
            hidden_size=64,
            dtype="bfloat16",
            eagle_aux_hidden_state_layer_ids=[1, 3, 4],
            sglang_layers_to_capture=[2, 4, 5],
            num_hidden_layers=8,
            final_hidden="pre_norm",
            architecture="LlamaForCausalLM",
        ),
    )
    return rid


def test_a_probe_of_another_run_left_in_staging_is_removed_after_the_grace_without_a_warning(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    stage_sample(dump, run, 0)
    probe = _stage_probe(dump, "0badc0de")  # sent by a client of another output, whose --dump-dir is elsewhere
    r = drain_until_done(dump, out, "speculators", "--record-grace", "0", lines=1)
    assert not (dump / probe).exists()
    assert "left alone" not in r.stderr, "nothing to warn about: a probe is no other run's sample"
    status = json.loads((out / ".hsextract" / "drain-status.json").read_text())
    assert status["foreign"] == {} and status["stale_removed_by_reason"] == {"probe left behind": 1}, status


def test_a_fresh_probe_of_another_run_is_left_to_its_sender(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    stage_sample(dump, run, 0)
    probe = _stage_probe(dump, "0badc0de")
    drain_until_done(dump, out, "speculators", lines=1)  # the default grace: 300 s
    assert (dump / probe / "done.json").exists()
