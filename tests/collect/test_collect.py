"""hsextract collect on real host outputs: every sample once, verified, renumbered into the trainer's
convention, accounted for, with the hosts' summed vocabulary and one card; a second collect changes
nothing, a grown host adds only what is new."""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np
import pytest
import torch
from hsextract.collect.report_file import read_collect_report
from hsextract.formats import get_format
from hsextract.output.accounts import read_accounts
from hsextract.output.layout import collect_report_path
from hsextract.output.manifest import iter_entries, read_header, verify_entry
from hsextract.shard import Shard
from hsextract.vocab.counts import TokenCounts
from hsextract.vocab.files import read_token_freq
from hsextract.vocab.mapping import select_tokens, sorted_mapping
from support.drain_proc import hsextract
from support.fleet import HostPlan, drain_host, make_fleet, snapshot, tokens_of

FORMATS = ["specforge", "speculators", "speculators-v1", "modelopt"]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _host_entries(fleet) -> dict[tuple[str, int], object]:
    return {(name, e.output_index): e for name, path in fleet.hosts.items() for e in iter_entries(path)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_hosts_sample_is_collected_once_byte_for_byte_with_its_host_and_index_there(
    fmt, fleets, collect, tmp_path
):
    fleet, into = fleets(fmt), tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args())
    assert code == 0, err
    entries = list(iter_entries(into))
    assert [e.dataset_index for e in entries] == sorted(fleet.samples), "each sample once, in dataset order"
    assert [e.output_index for e in entries] == list(range(len(entries)))
    fmt_ = get_format(fmt)
    hosts = _host_entries(fleet)
    for e in entries:
        assert e.file == fmt_.relative_path(e.output_index)
        src = hosts[(e.host, e.host_index)]
        assert (src.dataset_index, src.checksum, src.fingerprint, src.tokens) == (
            e.dataset_index,
            e.checksum,
            e.fingerprint,
            e.tokens,
        )
        assert (into / e.file).read_bytes() == (fleet.hosts[e.host] / src.file).read_bytes()
        assert verify_entry(into, e) is None
    assert read_header(into) == read_header(fleet.hosts["a"])


def test_the_fleets_reconciliation_is_printed_and_is_the_collected_sets_own(fleets, collect, tmp_path):
    fleet, into = fleets("speculators"), tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args())
    assert code == 0, err
    assert "host b: 10 accepted = 9 in the set + 1 failed + 0 quarantined" in err
    assert "host c: 9 in its set = 9 collected + 0 failed verification + 0 not fetched yet" in err
    assert "fleet: 30 dataset lines = 29 accepted + 1 rejected" in err
    assert "fleet: 29 accepted = 27 in the set + 1 failed + 1 quarantined" in err
    acc = read_accounts(into)  # the collected set reconciles as one output directory of the whole dataset
    assert acc is not None and acc.final and acc.unaccounted == []
    assert (acc.lines, acc.in_set, acc.rejected, acc.failed, acc.quarantined) == (
        30,
        27,
        {"empty_turn": 1},
        {"capture_failed": 1},
        {"token_mismatch": 1},
    )
    failures = [json.loads(line) for line in (into / ".hsextract" / "failures.jsonl").read_text().splitlines()]
    assert [(d["index"], d["host"]) for d in failures] == [(4, "b")]
    assert json.loads((into / "quarantine" / "hsx-c011ec70-5" / "host.json").read_text())["host"] == "c"


def test_speculators_hs_i_holds_the_tokens_of_arrow_row_i(fleets, collect, tmp_path):
    import datasets
    from safetensors.torch import load_file

    fleet, into = fleets("speculators"), tmp_path / "collected"
    assert collect("--into", str(into), *fleet.args())[0] == 0
    ds = datasets.load_from_disk(str(into))
    assert len(ds) == len(fleet.samples)
    for e in iter_entries(into):
        row = ds[e.output_index]
        hs = load_file(into / f"hidden_states/hs_{e.output_index}.safetensors")
        assert torch.equal(torch.as_tensor(row["input_ids"]), hs["token_ids"])
        assert torch.equal(hs["token_ids"], fleet.samples[e.dataset_index].input_ids)
        assert row["seq_len"] == tokens_of(e.dataset_index)


def test_modelopt_conversation_ids_are_the_dataset_indices_unique_across_hosts(fleets, collect, tmp_path):
    fleet, into = fleets("modelopt"), tmp_path / "collected"
    assert collect("--into", str(into), *fleet.args())[0] == 0
    ids = [torch.load(p, weights_only=True)["conversation_id"] for p in into.rglob("*.pt")]
    assert sorted(ids) == sorted(fleet.samples) and len(set(ids)) == len(ids)


def test_specforge_reader_order_lists_each_position_of_the_sorted_paths(fleets, collect, tmp_path):
    fleet, into = fleets("specforge"), tmp_path / "collected"
    assert collect("--into", str(into), *fleet.args())[0] == 0
    order = json.loads((into / "reader_order.json").read_text())["order"]
    sorted_paths = sorted(str(p.resolve()) for p in into.rglob("*.ckpt"))
    by_index = {e.output_index: e for e in iter_entries(into)}
    assert [str((into / by_index[i].file).resolve()) for i, *_ in order] == sorted_paths
    assert [row[1:] for row in order] == [
        [by_index[i].dataset_index, by_index[i].host, by_index[i].host_index] for i, *_ in order
    ]
    assert order[1][0] == 1 and order[2][0] == 10, "data_10.ckpt sorts before data_2.ckpt"


def test_the_draft_vocabulary_is_written_for_the_sum_of_the_hosts_counts(fleets, collect, tmp_path):
    fleet, into = fleets("speculators"), tmp_path / "collected"
    assert collect("--into", str(into), *fleet.args())[0] == 0
    summed = TokenCounts()
    for path in fleet.hosts.values():
        summed.merge(read_token_freq(path / "token_freq.pt"))
    assert read_token_freq(into / "token_freq.pt") == summed
    for size in (16, 64):
        d2t, t2d = sorted_mapping(select_tokens(summed, size), 1000)
        assert np.array_equal(np.load(into / f"d2t-{size}.npy"), d2t)
        assert np.array_equal(np.load(into / f"t2d-{size}.npy"), t2d)
    r = hsextract("finalize", "--output", str(into), "--verify", "--draft-vocab-size", "16", "64")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"verified {len(fleet.samples)}/{len(fleet.samples)} samples" in r.stdout
    assert "equal a recount" in r.stdout


def test_one_dataset_card_describes_the_collected_set(fleets, collect, tmp_path):
    fleet, into = fleets("speculators"), tmp_path / "collected"
    assert collect("--into", str(into), *fleet.args())[0] == 0
    card = (into / "README.md").read_text()
    assert "| samples | 27 (" in card and "| run id | `c011ec70` |" in card
    assert "| a | 0/3 | 9 | finished |" in card and "| c | 2/3 | 9 | finished |" in card
    assert "fleet: 29 accepted = 27 in the set + 1 failed + 1 quarantined" in card
    assert f"`--data-path {into}`" in card


@pytest.mark.parametrize("mode", [[], ["--link"]], ids=["copy", "link"])
def test_a_second_collect_changes_no_file(mode, fleets, collect, tmp_path):
    fleet, into = fleets("speculators"), tmp_path / "collected"
    assert collect("--into", str(into), *mode, *fleet.args())[0] == 0
    before = snapshot(into)
    code, err = collect("--into", str(into), *mode, *fleet.args())
    assert code == 0, err
    assert "collected 0 new sample(s)" in err and "(27 were there already)" in err
    assert snapshot(into) == before


def test_a_host_still_extracting_is_collected_as_far_as_committed_and_then_adds_only_what_is_new(collect, tmp_path):
    plans = [HostPlan("a", Shard(0, 2)), HostPlan("b", Shard(1, 2))]
    fleet = make_fleet(tmp_path / "fleet", "speculators", plans[:1], 20)
    b = tmp_path / "fleet" / "b"
    from hsextract.output.dataset_record import check_and_record

    check_and_record(b, fleet.dataset, has_samples=False)
    first = drain_host(b, tmp_path / "dump-b", "speculators", plans[1], 20, [1, 3, 5], finished=False)
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args("a"), f"b={b}")
    assert code == 0, err
    assert "host b: 10 accepted = 3 in the set + 0 failed + 0 quarantined + 7 on the way" in err
    assert Counter(e.host for e in iter_entries(into)) == {"a": 10, "b": 3}
    before = snapshot(into / "hidden_states")
    more = drain_host(b, tmp_path / "dump-b", "speculators", plans[1], 20, [7, 9, 11, 13, 15, 17, 19])
    code, err = collect("--into", str(into), *fleet.args("a"), f"b={b}")
    assert code == 0, err
    assert "collected 7 new sample(s)" in err
    entries = list(iter_entries(into))
    assert [e.dataset_index for e in entries[13:]] == [7, 9, 11, 13, 15, 17, 19]
    assert sorted(e.dataset_index for e in entries) == sorted({**fleet.samples, **first, **more})
    after = snapshot(into / "hidden_states")
    assert {k: after[k] for k in before} == before, "the samples collected first are untouched"


def test_link_shares_the_hosts_files_without_copying_them(fleets, collect, tmp_path):
    fleet, into = fleets("speculators"), tmp_path / "collected"
    assert collect("--into", str(into), "--link", *fleet.args())[0] == 0
    for e in iter_entries(into):
        src = fleet.hosts[e.host] / get_format("speculators").relative_path(e.host_index)
        assert os.stat(into / e.file).st_ino == os.stat(src).st_ino


def test_move_takes_the_sample_files_from_the_hosts(fleets, collect, tmp_path):
    fleet = fleets("speculators").copy(tmp_path / "hosts")
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), "--move", *fleet.args())
    assert code == 0, err
    assert [e.dataset_index for e in iter_entries(into)] == sorted(fleet.samples)
    assert all(verify_entry(into, e) is None for e in iter_entries(into))
    assert not [f for p in fleet.hosts.values() for f in (p / "hidden_states").glob("hs_*.safetensors")]
    code, err = collect("--into", str(into), "--move", *fleet.args())
    assert code == 0 and "collected 0 new sample(s)" in err, err


def test_move_removes_the_host_files_a_killed_move_had_committed_but_not_removed(fleets, collect, tmp_path):
    fleet = fleets("speculators").copy(tmp_path / "hosts")
    into = tmp_path / "collected"
    assert collect("--into", str(into), "--link", *fleet.args())[0] == 0  # committed, host files still there
    before = snapshot(into)
    code, err = collect("--into", str(into), "--move", *fleet.args())
    assert code == 0 and "collected 0 new sample(s)" in err, err
    assert not [f for p in fleet.hosts.values() for f in (p / "hidden_states").glob("hs_*.safetensors")]
    assert snapshot(into) == before
    assert all(verify_entry(into, e) is None for e in iter_entries(into))


def test_a_damaged_host_file_is_fetched_again_then_listed_failed_with_its_reason(fleets, collect, tmp_path):
    fleet = fleets("speculators").copy(tmp_path / "hosts")
    victim = next(e for e in iter_entries(fleet.hosts["b"]) if e.dataset_index == 7)
    path = fleet.hosts["b"] / victim.file
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args())
    assert code == 3, err
    assert f"FAILED b sample {victim.output_index} (dataset index 7): collect_checksum: " in err
    assert "fleet: 29 accepted = 26 in the set + 2 failed + 1 quarantined" in err
    assert 7 not in {e.dataset_index for e in iter_entries(into)}
    failures = [json.loads(x) for x in (into / ".hsextract" / "failures.jsonl").read_text().splitlines()]
    assert {(d["index"], d["reason"]) for d in failures} == {(4, "capture_failed"), (7, "collect_checksum")}
    assert read_accounts(into).failed == {"capture_failed": 1, "collect_checksum": 1}
    before = snapshot(into)
    assert collect("--into", str(into), *fleet.args())[0] == 3
    assert snapshot(into) == before, "the same failure again adds nothing"
    path.write_bytes(bytes(data[:-1]) + bytes([data[-1] ^ 0xFF]))  # the host's file put right (rsync again)
    code, err = collect("--into", str(into), *fleet.args())
    assert code == 0, err
    assert 7 in {e.dataset_index for e in iter_entries(into)}
    assert read_accounts(into).failed == {"capture_failed": 1}


def test_a_copy_damaged_on_its_way_is_fetched_again_and_collected(fleets, collect, tmp_path, monkeypatch):
    from hsextract.collect import runner
    from hsextract.collect.transfer import Fetcher

    damaged: list[int] = []

    class DamagingFirstCopyOf7(Fetcher):  # a transfer that flips one byte, once: what a bad read looks like
        def place(self, p, tmp):
            super().place(p, tmp)
            if p.entry.dataset_index == 7 and not damaged:
                data = bytearray(tmp.read_bytes())
                data[100] ^= 1
                tmp.write_bytes(bytes(data))
                damaged.append(7)

    monkeypatch.setattr(runner, "Fetcher", DamagingFirstCopyOf7)
    fleet, into = fleets("speculators"), tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args())
    assert code == 0, err
    assert damaged == [7]
    assert 7 in {e.dataset_index for e in iter_entries(into)}
    assert all(verify_entry(into, e) is None for e in iter_entries(into))


def test_the_help_says_what_each_flag_does():
    r = hsextract("collect", "--help")
    assert r.returncode == 0
    for flag in (
        "--into",
        "--link",
        "--move",
        "--final",
        "--wait-for-space",
        "--workers",
        "--stale-after",
        "--draft-vocab-size",
        "[NAME=]HOST_OUTPUT",
    ):
        assert flag in r.stdout, flag
    assert "hard-link" in r.stdout and "exactly once" in r.stdout


def _status(output, capsys, *args: str) -> tuple[int, list[str]]:
    """``hsextract status`` on `output`; the fleets' hosts each fail or quarantine 1 of 10 samples on purpose."""
    from hsextract.cli import main

    capsys.readouterr()
    code = main(["status", "--output", str(output), "--max-failure-share", "0.2", *args])
    return code, capsys.readouterr().out.splitlines()


def test_status_of_a_collected_set_reports_the_sets_counts_not_a_missing_drain(fleets, collect, tmp_path, capsys):
    fleet, into = fleets("speculators"), tmp_path / "collected"
    assert collect("--into", str(into), *fleet.args())[0] == 0
    code, lines = _status(into, capsys)
    assert code == 0, lines
    assert lines[0] == "The collected set is final: 27 samples from 3 hosts are in the training set."
    assert not [line for line in lines if "FAIL" in line or "drain" in line]
    rows = {line.split()[0]: line.split(None, 1)[1] for line in lines[1:] if line.startswith("  ") and line[2] != " "}
    assert rows["samples"].startswith("27 in the set, collected from a (0/3): 9, b (1/3): 9, c (2/3): 9")
    assert rows["quarantined"].startswith("1, listed in ")
    assert "  counts         30 dataset lines = 29 accepted + 1 rejected" in lines
    assert "                 29 accepted = 27 in the set + 1 failed + 1 quarantined" in lines


def test_status_of_a_collected_set_still_missing_a_shard_is_not_final_and_says_which(fleets, collect, tmp_path, capsys):
    fleet, into = fleets("speculators"), tmp_path / "collected"
    assert collect("--into", str(into), *fleet.args("a", "b"))[0] == 0
    code, lines = _status(into, capsys)
    assert code == 0, lines
    assert lines[0] == (
        "The collected set is not final yet: 18 samples from 2 hosts are in the training set; "
        "collect again with every host once each has finished."
    )
    assert any("shard 2/3 is in no host output" in line for line in lines)
    code, lines = _status(into, capsys, "--json")
    out = json.loads("\n".join(lines))
    assert out["ok"] is True and out["collected"]["final"] is False and out["accounts"]["in_set"] == 18
    report = read_collect_report(into)  # the record collect wrote, read back to the byte
    assert report is not None and report.to_bytes() == collect_report_path(into).read_bytes()
    assert out["collected"]["hosts"] == {name: h.to_json() for name, h in report.hosts.items()}
    assert [str(s) for h in report.hosts.values() for s in h.shards] == ["0/3", "1/3"] and not report.final
