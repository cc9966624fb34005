"""``hsextract extract`` refuses a broken setup at once, with a message that says what and where."""

from __future__ import annotations

import json

import pytest
from hsextract.cli import main


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(["extract", *argv])
    return code, capsys.readouterr().err


def _flags(tmp_path, model, dataset) -> list[str]:
    return [
        "--server",
        "http://127.0.0.1:9",
        "--dataset",
        str(dataset),
        "--model",
        str(model),
        "--dump-dir",
        str(tmp_path / "dump"),
        "--output",
        str(tmp_path / "out"),
        "--format",
        "specforge",
    ]


def test_missing_dataset_stops_at_once_naming_it(capsys, tmp_path, tiny_llama):
    code, err = _run(capsys, *_flags(tmp_path, tiny_llama, tmp_path / "absent.jsonl"))
    assert code == 2
    assert "absent.jsonl does not exist" in err and "--dataset" in err


def test_an_empty_dataset_file_stops_at_once_as_an_empty_directory_does(capsys, tmp_path, tiny_llama):
    (tmp_path / "d.jsonl").write_bytes(b"")
    code, err = _run(capsys, *_flags(tmp_path, tiny_llama, tmp_path / "d.jsonl"))
    assert code == 2 and "d.jsonl is empty (0 bytes)" in err
    assert not (tmp_path / "out").exists(), "nothing is written before the setup is known to be usable"


def test_model_without_tokenizer_stops_at_once(capsys, tmp_path, tiny_llama):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((tiny_llama / "config.json").read_text())
    (tmp_path / "d.jsonl").write_text('{"input_ids": [1, 2]}\n')
    code, err = _run(capsys, *_flags(tmp_path, model, tmp_path / "d.jsonl"))
    assert code == 2 and "no usable tokenizer" in err and str(model) in err
    assert not (tmp_path / "out").exists(), "nothing is written before the setup is known to be usable"


def test_fp8_for_a_format_whose_reader_reads_bf16_only_stops_at_once(capsys, tmp_path, tiny_llama):
    (tmp_path / "d.jsonl").write_text('{"input_ids": [1, 2]}\n')
    code, err = _run(capsys, *_flags(tmp_path, tiny_llama, tmp_path / "d.jsonl"), "--precision", "fp8")
    assert code == 2
    assert "precision fp8: the specforge format's reader (SpecForge) reads bf16 rows only" in err, err
    assert not (tmp_path / "out").exists(), "nothing is written before the setup is known to be usable"


def test_missing_required_settings_are_named(capsys):
    code, err = _run(capsys, "--server", "http://127.0.0.1:9")
    assert code == 2
    assert "--dataset" in err and "--model" in err and "--dump-dir" in err and "--output" in err


@pytest.mark.parametrize("shard", ["2/2", "1", "a/b", "0/0"])
def test_bad_shard_is_refused_with_an_example(capsys, tmp_path, tiny_llama, shard):
    (tmp_path / "d.jsonl").write_text("")
    code, err = _run(capsys, *_flags(tmp_path, tiny_llama, tmp_path / "d.jsonl"), "--shard", shard)
    assert code == 2 and "shard" in err


def test_config_file_supplies_the_settings_and_flags_win(capsys, tmp_path, tiny_llama):
    cfg = tmp_path / "run.json"
    cfg.write_text(
        json.dumps(
            {
                "server": "http://127.0.0.1:9",
                "dataset": str(tmp_path / "from-config.jsonl"),
                "model": str(tiny_llama),
                "dump_dir": str(tmp_path / "dump"),
                "output": str(tmp_path / "out"),
                "shm_min_free": "5%",
                "format": "specforge",
                "workers": 2,  # a drain key: ignored here
            }
        )
    )
    code, err = _run(capsys, "--config", str(cfg))
    assert code == 2 and "from-config.jsonl does not exist" in err
    code, err = _run(capsys, "--config", str(cfg), "--dataset", str(tmp_path / "from-flag.jsonl"))
    assert code == 2 and "from-flag.jsonl does not exist" in err


def test_bad_watermark_in_config_is_refused(capsys, tmp_path, tiny_llama):
    (tmp_path / "d.jsonl").write_text("")
    code, err = _run(capsys, *_flags(tmp_path, tiny_llama, tmp_path / "d.jsonl"), "--shm-min-free", "lots")
    assert code == 2 and "watermark" in err


def test_malformed_aux_layers_are_refused(capsys, tmp_path, tiny_llama):
    (tmp_path / "d.jsonl").write_text("")
    code, err = _run(capsys, *_flags(tmp_path, tiny_llama, tmp_path / "d.jsonl"), "--aux-layers", "1,x")
    assert code == 2 and "aux layer ids" in err and "1,29,57" in err


def test_a_client_resuming_a_set_of_fp8_rows_in_bf16_stops_naming_both_before_it_records_anything(
    capsys, tmp_path, tiny_llama
):
    from hsextract.output.manifest import write_header
    from support.manifests import tiny_header

    out = tmp_path / "out"
    out.mkdir()
    write_header(out, tiny_header(precision="fp8"))
    header = (out / "manifest.json").read_bytes()
    (tmp_path / "d.jsonl").write_text('{"input_ids": [1, 2]}\n')
    flags = _flags(tmp_path, tiny_llama, tmp_path / "d.jsonl")
    flags[flags.index("--format") + 1] = "speculators"
    code, err = _run(capsys, *flags)
    assert code == 2
    assert "holds a training set of fp8 rows, but this client runs with --precision bf16" in err, err
    assert (out / "manifest.json").read_bytes() == header
    assert not (out / "run.json").exists() and not list(out.glob("*.jsonl")), "no run recorded, no sample"
