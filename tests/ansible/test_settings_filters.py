"""The hsextract role's filters check the run's settings with hsextract's own code.

roles/hsextract/filter_plugins/hsextract_checks.py is plain Python: it is loaded here from its file
and called as Ansible calls it, without Ansible. Each filter returns "" or one line that names the
Ansible variable; a setting is refused by the play exactly when hsextract refuses it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hsextract.errors import ConfigError
from hsextract.output import layout
from hsextract.shard import Shard
from hsextract.staging import records

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "roles" / "hsextract" / "filter_plugins" / "hsextract_checks.py"


def _load():
    spec = importlib.util.spec_from_file_location("hsextract_checks", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checks = _load()
LLAMA_8 = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8, "hidden_size": 64}


def test_ansible_sees_the_filters_under_their_hsextract_names():
    assert checks.FilterModule().filters() == {
        "hsextract_rid_prefix_problem": checks.rid_prefix_problem,
        "hsextract_shard_problem": checks.shard_problem,
        "hsextract_precision_problem": checks.precision_problem,
        "hsextract_aux_layer_problem": checks.aux_layer_problem,
        "hsextract_regenerated_dir_problem": checks.regenerated_dir_problem,
        "hsextract_dataset_switch_problem": checks.dataset_switch_problem,
        "hsextract_layout_path": checks.layout_path,
        "hsextract_client_processes_problem": checks.client_processes_problem,
        "hsextract_process_shards": checks.process_shards,
        "hsextract_summary_path": checks.summary_path,
        "hsextract_output_problem": checks.output_problem,
    }


@pytest.mark.parametrize(("precision", "fmt"), [("bf16", "specforge"), ("bf16", "speculators"), ("fp8", "speculators")])
def test_a_precision_the_formats_reader_reads_passes(precision, fmt):
    assert checks.precision_problem(precision, fmt) == ""


@pytest.mark.parametrize("fmt", ["specforge", "speculators-v1", "modelopt"])
def test_fp8_for_a_format_whose_reader_reads_bf16_only_is_refused_as_the_drain_refuses_it(fmt):
    from hsextract.formats import check_precision

    with pytest.raises(ConfigError) as refused:
        check_precision(fmt, "fp8")
    problem = checks.precision_problem("fp8", fmt)
    assert problem.startswith(f"hsextract_precision=fp8: {refused.value}"), problem


def test_a_bad_bucket_url_and_a_credentials_file_others_can_read_are_refused_naming_the_variable(tmp_path):
    assert "hsextract_output_dir" in checks.output_problem("s3://Bad_Bucket/x")
    assert checks.output_problem("/a/directory", "/nonexistent") == ""
    creds = tmp_path / "creds"
    creds.write_text("[default]\naws_access_key_id = AKIDEXAMPLE\naws_secret_access_key = s3cr3t\n")
    creds.chmod(0o644)
    problem = checks.output_problem("s3://sets/run", str(creds))
    assert "hsextract_s3_credentials_src" in problem and "chmod 600" in problem and "s3cr3t" not in problem
    creds.chmod(0o600)
    assert checks.output_problem("s3://sets/run", str(creds), "http://127.0.0.1:8333") == ""
    assert "hsextract_s3_endpoint" in checks.output_problem("s3://sets/run", str(creds), "127.0.0.1:8333")


def test_the_plugin_and_what_it_imports_need_only_the_standard_library():
    # -S: no site-packages, so a third-party import would fail; and no module outside the stdlib is loaded.
    code = (
        f"import importlib.util, sys\nspec = importlib.util.spec_from_file_location('p', {str(PLUGIN)!r})\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'__main__', 'p'}))"
    )
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['hsextract']"


@pytest.mark.parametrize("prefix", ["hsx", "run2", "a_b.c", "a-b", "", "HEALTH_CHECKx", "sp ace"])
def test_a_rid_prefix_is_refused_exactly_when_the_client_refuses_it(prefix):
    try:
        records.check_prefix(prefix)
        client_accepts = True
    except ConfigError:
        client_accepts = False
    problem = checks.rid_prefix_problem(prefix)
    assert (problem == "") == client_accepts, problem
    if problem:
        assert problem.startswith("hsextract_rid_prefix: rid prefix ") and "e.g. 'hsx'" in problem


@pytest.mark.parametrize("shard", ["", "0/1", "2/4"])
def test_the_whole_dataset_and_a_valid_shard_pass(shard):
    assert checks.shard_problem(shard) == ""


@pytest.mark.parametrize(
    ("shard", "says"),
    [
        ("4/4", "hsextract_shard: shard '4/4': need 0 <= i < n"),
        ("1/0", "hsextract_shard: shard '1/0': need 0 <= i < n"),
        ("half", "hsextract_shard: shard 'half': expected i/n, e.g. 0/4"),
        ("1/2/3", "hsextract_shard: shard '1/2/3': expected i/n"),
    ],
)
def test_a_shard_the_client_refuses_is_refused_with_its_message(shard, says):
    assert checks.shard_problem(shard).startswith(says)


def test_a_shard_the_client_reads_but_a_unit_command_line_would_split_asks_for_its_plain_spelling():
    assert checks.shard_problem(" 1/ 2") == "hsextract_shard: shard ' 1/ 2': write it as '1/2'."


@pytest.mark.parametrize("ids", [[], [1, 3, 4], "1,3,4", [0, 5, 900]])
def test_aux_layer_ids_in_order_pass_before_the_models_depth_is_known(ids):
    assert checks.aux_layer_problem(ids, "eagle") == ""


def test_aux_layer_ids_out_of_order_are_refused_without_the_model():
    problem = checks.aux_layer_problem([3, 1, 4], "eagle")
    assert problem.startswith("hsextract_aux_layer_ids=[3, 1, 4]: ")
    assert "must be strictly increasing without repeats" in problem


def test_an_sglang_layer_id_below_one_is_refused_without_the_model():
    problem = checks.aux_layer_problem([0, 2], "sglang")
    assert "[0] below 1, the first valid id" in problem


def test_aux_layer_ids_past_the_models_depth_name_the_range_and_the_model():
    problem = checks.aux_layer_problem([1, 3, 40], "eagle", LLAMA_8, "/models/llama")
    assert problem.startswith("hsextract_aux_layer_ids=[1, 3, 40] with hsextract_model_path=/models/llama: ")
    assert "8 layers: [40] not in [0, 6]" in problem


def test_the_sglang_convention_shifts_the_valid_range_by_one():
    assert checks.aux_layer_problem([1, 7], "sglang", LLAMA_8, "/m") == ""
    assert "[8] not in [1, 7]" in checks.aux_layer_problem([1, 8], "sglang", LLAMA_8, "/m")


def test_the_default_is_checked_against_a_model_too_shallow_for_it():
    problem = checks.aux_layer_problem([], "eagle", {"num_hidden_layers": 4}, "/m")
    assert problem.startswith("hsextract_aux_layer_ids=[] (the EAGLE-3 default) with hsextract_model_path=/m: ")
    assert checks.aux_layer_problem([], "eagle", LLAMA_8, "/m") == ""


def test_a_multimodal_wrappers_text_config_gives_the_depth():
    kimi = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {"num_hidden_layers": 61}}
    assert checks.aux_layer_problem([1, 29, 57], "eagle", kimi, "/m") == ""
    assert "[60] not in [0, 59]" in checks.aux_layer_problem([1, 29, 60], "eagle", kimi, "/m")


def test_a_config_without_a_layer_count_is_refused_naming_the_model():
    assert checks.aux_layer_problem([1], "eagle", {"architectures": ["X"]}, "/m") == (
        "hsextract_model_path=/m: its config.json gives no num_hidden_layers (needed to place the capture layers)."
    )


@pytest.mark.parametrize("regenerated", ["/data/regenerated", "/data/set-regenerated", "/var/lib/hsextract/regen"])
def test_a_regenerated_dataset_outside_the_source_passes(regenerated):
    assert checks.regenerated_dir_problem(regenerated, "/data/set") == ""


@pytest.mark.parametrize(
    "regenerated", ["regenerated", "/data/set", "/data/set/", "/data/set/regenerated", "/data/other/../set/x"]
)
def test_a_regenerated_dataset_that_is_relative_or_inside_the_source_is_refused(regenerated):
    problem = checks.regenerated_dir_problem(regenerated, "/data/set")
    assert problem.startswith("hsextract_regenerated_dir must be an absolute path on the host outside the dataset")
    assert f"hsextract_regenerated_dir='{regenerated}'" in problem


def record(path: str) -> str:
    """An output's dataset record as the client writes it (only the path matters to the play)."""
    return json.dumps({"path": path, "resolved": path, "fingerprint": {"method": "sha256-of-heads-v1", "files": []}})


SWITCH = {"output_dir": "/out", "regenerated_dir": "/regen"}


def test_resuming_the_set_of_the_dataset_the_extraction_reads_passes():
    assert (
        checks.dataset_switch_problem(
            record("/data/src.jsonl"), extract_dataset="/data/src.jsonl", regenerate=False, **SWITCH
        )
        == ""
    )
    assert checks.dataset_switch_problem(record("/regen/"), extract_dataset="/regen", regenerate=True, **SWITCH) == ""


def test_a_set_of_another_source_dataset_is_left_to_the_clients_own_check():
    # Neither is the regenerated dataset: a moved or renamed source is the same dataset to the client.
    assert (
        checks.dataset_switch_problem(
            record("/data/old.jsonl"), extract_dataset="/data/src.jsonl", regenerate=False, **SWITCH
        )
        == ""
    )


def test_switching_the_regeneration_on_for_a_set_of_the_source_is_refused_naming_both_and_the_fix():
    problem = checks.dataset_switch_problem(
        record("/data/src.jsonl"), extract_dataset="/regen", regenerate=True, **SWITCH
    )
    assert problem.startswith(
        "hsextract_output_dir=/out holds a training set extracted from /data/src.jsonl "
        f"(recorded in {layout.dataset_record_path('/out')}), but with hsextract_regenerate=True "
        "the extraction reads /regen (expected: the set's dataset is the one"
    )
    assert problem.endswith(
        "Set hsextract_output_dir to a new directory for this dataset, or hsextract_regenerate "
        "back to False to go on with the training set of /data/src.jsonl."
    )


def test_switching_the_regeneration_off_for_a_set_of_the_regenerated_dataset_is_refused():
    problem = checks.dataset_switch_problem(
        record("/regen"), extract_dataset="/data/src.jsonl", regenerate=False, **SWITCH
    )
    assert "extracted from /regen" in problem and "or hsextract_regenerate back to True" in problem


def test_an_unreadable_record_is_refused_naming_its_file():
    problem = checks.dataset_switch_problem("{not json", extract_dataset="/regen", regenerate=True, **SWITCH)
    assert problem.startswith(f"{layout.dataset_record_path('/out')}: unreadable (")


@pytest.mark.parametrize("name", ["client_summary", "regen_summary", "dataset_record", "drain_status"])
def test_a_layout_path_is_the_layout_modules(name):
    assert checks.layout_path("/out", name) == str(getattr(layout, f"{name}_path")("/out"))


def test_an_unknown_layout_file_is_an_error_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"has no file 'client_sumary'; it has .*client_summary"):
        checks.layout_path("/out", "client_sumary")


@pytest.mark.parametrize("value", ["auto", 1, 8, "2"])
def test_auto_or_a_number_of_client_processes_passes(value):
    assert checks.client_processes_problem(value) == ""


@pytest.mark.parametrize(
    ("value", "says"), [(0, "P >= 1"), (-2, "P >= 1"), ("many", "got 'many'"), (True, "got True"), ("2.5", "got '2.5'")]
)
def test_a_number_of_client_processes_the_client_refuses_is_refused_naming_the_variable(value, says):
    problem = checks.client_processes_problem(value)
    assert problem.startswith("hsextract_client_processes: expected auto or a number of client processes >= 1")
    assert says in problem


def test_the_processes_shards_are_the_clients_sub_shards_of_the_host_shard():
    assert checks.process_shards("1/2", 2) == ["1/4", "3/4"]
    assert checks.process_shards("0/1", 1) == ["0/1"]


def test_a_processs_summary_is_the_file_its_client_writes():
    assert checks.summary_path("3/4", "/o") == str(layout.client_summary_path("/o", Shard(3, 4)))
    assert checks.summary_path("0/1", "/o") == str(layout.client_summary_path("/o"))
