"""One training set, one model: the drain records the model's fingerprint (weights, tokenizer, chat
template) in the manifest header and refuses to go on with another model; collect refuses a host
that served other weights under the same config.json."""

from __future__ import annotations

import pytest
from hsextract.cli import main
from hsextract.drain.config import DrainConfig
from hsextract.drain.core import Drainer
from hsextract.errors import ConfigError
from hsextract.model_fingerprint import model_fingerprint
from hsextract.output.dataset_record import check_and_record
from hsextract.output.manifest import iter_entries, read_header
from hsextract.shard import Shard
from support.fleet import HostPlan, drain_host, write_dataset

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
LINES = 10


def _host(root, name, shard, model, dataset):
    out = root / name
    out.mkdir()
    check_and_record(out, dataset, has_samples=False)
    drain_host(
        out, root / f"dump-{name}", "speculators", HostPlan(name, shard), LINES, shard.indices(LINES), model=model
    )
    return out


def test_the_manifest_header_records_the_fingerprint_of_the_model_the_drain_was_given(tiny_llama, tmp_path):
    out = _host(tmp_path, "a", Shard(0, 1), tiny_llama, write_dataset(tmp_path / "train.jsonl", LINES))
    assert read_header(out).model_fingerprint == model_fingerprint(tiny_llama)


def test_collect_refuses_a_host_that_served_other_weights_of_the_same_config(
    tiny_llama, tiny_llama_seed2, tmp_path, capsys
):
    dataset = write_dataset(tmp_path / "train.jsonl", LINES)
    a = _host(tmp_path, "a", Shard(0, 2), tiny_llama, dataset)
    b = _host(tmp_path, "b", Shard(1, 2), tiny_llama_seed2, dataset)
    assert read_header(a).model_config_sha256 == read_header(b).model_config_sha256
    capsys.readouterr()
    code = main(["collect", "--into", str(tmp_path / "set"), f"a={a}", f"b={b}"])
    err = capsys.readouterr().err
    assert code == 3, err
    (line,) = [line for line in err.splitlines() if "refused" in line]
    weights = model_fingerprint(tiny_llama)["weights"][:16], model_fingerprint(tiny_llama_seed2)["weights"][:16]
    assert (
        f"host b ({b}) refused: model weights (sha256) is '{weights[1]}', expected '{weights[0]}' (as host a "
        "has it)" in line
    )
    assert "tokenizer" not in line and "chat template" not in line
    assert {e.host for e in iter_entries(tmp_path / "set")} == {"a"}


def test_the_drain_refuses_to_go_on_with_an_output_written_with_another_models_weights(
    tiny_llama, tiny_llama_seed2, tmp_path
):
    out = _host(tmp_path, "a", Shard(0, 1), tiny_llama, write_dataset(tmp_path / "train.jsonl", LINES))
    cfg = DrainConfig(dump_dir=tmp_path / "dump-a", output=out, format="speculators", model_path=str(tiny_llama_seed2))
    with pytest.raises(ConfigError, match=f"written with other model weights than {tiny_llama_seed2} has"):
        Drainer(cfg).run()
