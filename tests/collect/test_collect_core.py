"""The pure core of collect: which hosts belong together, whether their shards cover the dataset,
and what is fetched in which order. Decided from manifests and records alone, no file copied."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hsextract.collect.admit import admit, choose_reference
from hsextract.collect.hosts import ClientShard, HostOutput, parse_host_argument
from hsextract.collect.selection import Pending, collected_entry, select_entries
from hsextract.collect.shards import check_coverage, shard_indices
from hsextract.output.manifest import ManifestEntry, ManifestHeader
from hsextract.shard import Shard
from support.manifests import tiny_header

HEADER = tiny_header(
    model_path="/models/tiny",
    model_config_sha256="ab" * 32,
    architecture="LlamaForCausalLM",
    vocab_size=1000,
    run_id="c011ec70",
)
DATASET = {
    "path": "/data/train.jsonl",
    "fingerprint": {"method": "sha256-of-heads-v1", "files": [{"name": None, "bytes": 99, "sha256": "5" * 64}]},
}


def _entry(i: int, x: int, host: str = "", host_index: int = -1) -> ManifestEntry:
    return ManifestEntry(
        output_index=i,
        dataset_index=x,
        rid=f"hsx-c011ec70-{x}",
        tokens=5,
        file=f"hidden_states/hs_{i}.safetensors",
        bytes=100 + x,
        checksum=f"sha256:{x:064x}",
        fingerprint=f"{x:016x}",
        host=host,
        host_index=host_index,
    )


FIRST = Shard(0, 3)


def _host(
    name: str,
    shard=FIRST,
    header: ManifestHeader | None = HEADER,
    dataset=DATASET,
    lines=30,
    finished=True,
    drain_busy="",
    behind=(),
) -> HostOutput:
    return HostOutput(
        name,
        Path(f"/staging/{name}"),
        header,
        [],
        dataset,
        [ClientShard(shard, lines, finished)],
        drain_busy,
        list(behind),
    )


# -- shards -----------------------------------------------------------------------------------------


def test_shards_i_of_n_of_every_i_cover_the_dataset_once():
    cov = check_coverage({"a": [Shard(0, 3)], "b": [Shard(1, 3)], "c": [Shard(2, 3)]}, lines=30)
    assert cov.complete and cov.missing == [] and cov.doubled == []


def test_a_missing_shard_is_named_with_its_first_dataset_indices():
    cov = check_coverage({"a": [Shard(0, 3)], "c": [Shard(2, 3)]}, lines=30)
    assert cov.missing == ["shard 1/3 is in no host output (dataset indices 1, 4, 7, 10 ...)"]
    assert not cov.complete


def test_a_shard_given_to_two_hosts_names_both():
    cov = check_coverage({"a": [Shard(0, 2)], "b": [Shard(1, 2)], "c": [Shard(1, 2)]}, lines=10)
    assert cov.doubled == ["dataset index 1 (and each 2 later) is in the shards of b (1/2) and c (1/2)"]


def test_shards_of_different_sizes_that_partition_the_dataset_are_complete():
    assert check_coverage({"a": [Shard(0, 2)], "b": [Shard(1, 4)], "c": [Shard(3, 4)]}, lines=17).complete
    cov = check_coverage({"a": [Shard(0, 2)], "b": [Shard(1, 4)]}, lines=17)
    assert cov.missing == ["dataset indices 3 (and each 4 later) are in no host's shard"]


def test_a_host_output_of_several_shards_covers_them_all():
    assert check_coverage({"a": [Shard(0, 4), Shard(2, 4)], "b": [Shard(1, 2)]}, lines=9).complete
    assert shard_indices([Shard(0, 4), Shard(2, 4)], 9) == [0, 2, 4, 6, 8]


# -- which hosts belong together --------------------------------------------------------------------

FIELDS = [
    ("format", "modelopt", "format"),
    ("final_hidden", "post_norm", "final-norm placement"),
    ("dtype", "float16", "dtype"),
    ("hidden_size", 128, "hidden size"),
    ("eagle_aux_hidden_state_layer_ids", [1, 2, 4], "layers (eagle convention)"),
    ("sglang_layers_to_capture", [2, 3, 5], "layers (sglang convention)"),
    ("model_config_sha256", "cd" * 32, "model (config.json sha256)"),
    ("run_id", "0badc0de", "run identity"),
]


@pytest.mark.parametrize(("field", "value", "name"), FIELDS, ids=[f[0] for f in FIELDS])
def test_a_host_whose_header_differs_is_refused_naming_host_field_expected_and_actual(field, value, name):
    other = dataclasses.replace(HEADER, **{field: value})
    hosts = [_host("a"), _host("b", Shard(1, 3), other), _host("c", Shard(2, 3))]
    adm = admit(hosts, choose_reference(None, None, None, hosts), final=False, move=False)
    assert [h.name for h in adm.admitted] == ["a", "c"]
    (line,) = adm.refused
    assert line.startswith("host b (/staging/b) refused: ")
    assert f"{name} is {value!r}, expected {getattr(HEADER, field)!r} (as host a has it)" in line


def test_the_model_is_compared_by_its_config_not_its_path_where_both_hosts_record_one():
    moved = dataclasses.replace(HEADER, model_path="/mnt/models/tiny")
    hosts = [_host("a"), _host("b", Shard(1, 3), moved)]
    assert admit(hosts, choose_reference(None, None, None, hosts), final=False, move=False).refused == []
    unhashed = dataclasses.replace(moved, model_config_sha256="")
    hosts = [_host("a"), _host("b", Shard(1, 3), unhashed)]
    (line,) = admit(hosts, choose_reference(None, None, None, hosts), final=False, move=False).refused
    assert "model path is '/mnt/models/tiny', expected '/models/tiny'" in line


def test_a_host_of_another_dataset_is_refused_by_its_fingerprint_and_one_of_another_size_by_its_lines():
    other = json.loads(json.dumps(DATASET))
    other["path"] = "/data/other.jsonl"
    other["fingerprint"]["files"][0]["sha256"] = "6" * 64
    hosts = [_host("a"), _host("b", Shard(1, 3), dataset=other), _host("c", Shard(2, 3), lines=31)]
    adm = admit(hosts, choose_reference(None, None, None, hosts), final=False, move=False)
    assert [h.name for h in adm.admitted] == ["a"]
    assert (
        "dataset fingerprint is '/data/other.jsonl (first 99 bytes sha256 6666666666666666)', expected "
        "'/data/train.jsonl (first 99 bytes sha256 5555555555555555)'" in adm.refused[0]
    )
    assert "dataset lines is 31, expected 30" in adm.refused[1]


def test_the_collected_sets_own_header_is_the_reference_once_it_has_one():
    hosts = [_host("a", header=dataclasses.replace(HEADER, run_id="0badc0de")), _host("b", Shard(1, 3))]
    ref = choose_reference(HEADER, DATASET, 30, hosts)
    adm = admit(hosts, ref, final=False, move=False)
    assert [h.name for h in adm.admitted] == ["b"]
    assert "run identity is '0badc0de', expected 'c011ec70' (as the collected set has it)" in adm.refused[0]


def test_a_final_collect_refuses_a_host_not_finished_which_a_plain_collect_takes():
    behind = _host("b", Shard(1, 3), drain_busy="its drain's status says 'running', 2 s ago", behind=[4, 7])
    running = _host("c", Shard(2, 3), finished=False)
    hosts = [_host("a"), behind, running]
    ref = choose_reference(None, None, None, hosts)
    assert [h.name for h in admit(hosts, ref, final=False, move=False).admitted] == ["a", "b", "c"]
    adm = admit(hosts, ref, final=True, move=False)
    assert [h.name for h in adm.admitted] == ["a"]
    assert adm.refused[0] == (
        "host b (/staging/b) refused for --final: its drain has not caught up: 2 accepted sample(s) (dataset indices "
        "4, 7) are in neither its set, its failures nor its quarantine; its drain is at it (its drain's status says "
        "'running', 2 s ago): wait for it, then collect again"
    )
    assert "host c (/staging/c) refused for --final: its client has not finished" in adm.refused[1]


def test_a_drain_idling_on_a_finished_host_refuses_a_move_but_not_a_final_collect():
    idle = _host("b", Shard(1, 3), drain_busy="a process holds its lock (.hsextract/output.lock)")
    hosts = [_host("a"), idle]
    ref = choose_reference(None, None, None, hosts)
    assert [h.name for h in admit(hosts, ref, final=True, move=False).admitted] == ["a", "b"]
    adm = admit(hosts, ref, final=False, move=True)
    assert [h.name for h in adm.admitted] == ["a"]
    assert adm.refused == [
        "host b (/staging/b) refused for --move: a drain runs on it (a process holds its lock "
        "(.hsextract/output.lock)); stop it first, then collect again"
    ]


def test_a_host_output_is_named_after_its_directory_unless_named():
    assert parse_host_argument("/staging/gpu-b01") == ("gpu-b01", Path("/staging/gpu-b01"))
    assert parse_host_argument("b01=/staging/x") == ("b01", Path("/staging/x"))
    assert parse_host_argument("./a=b/c") == ("c", Path("./a=b/c"))  # a '=' inside a path is part of it


# -- what is fetched, in which order ------------------------------------------------------------------


def test_pending_samples_go_in_dataset_index_order_after_the_collected_ones():
    hosts = {"a": [_entry(0, 6), _entry(1, 0), _entry(2, 3)], "b": [_entry(0, 4), _entry(1, 1)]}
    plan = select_entries([], hosts)
    assert [(p.host, p.entry.dataset_index) for p in plan.pending] == [("a", 0), ("b", 1), ("a", 3), ("b", 4), ("a", 6)]
    collected = [collected_entry(p, i, f"hidden_states/hs_{i}.safetensors") for i, p in enumerate(plan.pending)]
    again = select_entries(collected, {**hosts, "a": [*hosts["a"], _entry(3, 9)]})
    assert [(p.host, p.entry.dataset_index) for p in again.pending] == [("a", 9)]
    assert len(again.already) == 5 and again.duplicates == []


def test_a_collected_entry_keeps_the_hosts_checksum_and_fingerprint_and_records_where_it_came_from():
    e = collected_entry(Pending("b", _entry(7, 22)), 3, "hidden_states/hs_3.safetensors")
    assert (e.output_index, e.file, e.host, e.host_index) == (3, "hidden_states/hs_3.safetensors", "b", 7)
    assert (e.dataset_index, e.checksum, e.fingerprint, e.bytes) == (22, f"sha256:{22:064x}", f"{22:016x}", 122)
    line = json.loads(e.to_line())
    assert (line["host"], line["host_index"]) == ("b", 7)
    assert "host" not in json.loads(_entry(7, 22).to_line()), "a drain's manifest lines stay as they were"


def test_a_dataset_index_of_two_hosts_is_collected_once_and_the_other_reported():
    plan = select_entries([], {"a": [_entry(0, 5)], "b": [_entry(0, 5), _entry(1, 8)]})
    assert [(p.host, p.entry.dataset_index) for p in plan.pending] == [("a", 5), ("b", 8)]
    assert plan.duplicates == ["host b sample 0 (dataset index 5) is also in host a: left out (their shards overlap)"]


FINGERPRINT = {"method": "hsextract-model-v1", "weights": "1" * 64, "tokenizer": "2" * 64, "chat_template": "3" * 64}
PARTS = [
    ("weights", "model weights (sha256)"),
    ("tokenizer", "model tokenizer (sha256)"),
    ("chat_template", "model chat template (sha256)"),
]


@pytest.mark.parametrize(("part", "name"), PARTS, ids=[p for p, _ in PARTS])
def test_a_host_of_other_weights_tokenizer_or_chat_template_is_refused_naming_the_part(part, name):
    ref = dataclasses.replace(HEADER, model_fingerprint=FINGERPRINT)
    other = dataclasses.replace(HEADER, model_fingerprint={**FINGERPRINT, part: "9" * 64})
    hosts = [_host("a", header=ref), _host("b", Shard(1, 3), other)]
    (line,) = admit(hosts, choose_reference(None, None, None, hosts), final=False, move=False).refused
    assert line.startswith("host b (/staging/b) refused: ")
    assert f"{name} is '9999999999999999', expected '{FINGERPRINT[part][:16]}' (as host a has it)" in line
    assert line.count("sha256)") == 1, "only the part that differs is named"


def test_a_host_with_no_fingerprint_is_refused_beside_one_that_has_one_and_taken_beside_one_that_has_none():
    hosts = [_host("a", header=dataclasses.replace(HEADER, model_fingerprint=FINGERPRINT)), _host("b", Shard(1, 3))]
    (line,) = admit(hosts, choose_reference(None, None, None, hosts), final=False, move=False).refused
    assert (
        "model fingerprint is 'none recorded (an output of an hsextract before model fingerprints, or of a "
        "model given by name)', expected 'weights 1111111111111111, tokenizer 2222222222222222, chat template "
        "3333333333333333' (as host a has it)" in line
    )
    hosts = [_host("a"), _host("b", Shard(1, 3))]
    assert admit(hosts, choose_reference(None, None, None, hosts), final=False, move=False).refused == []
