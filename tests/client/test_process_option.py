"""``hsextract extract --process j/P``: one of P client processes, on its sub-shard of the shard."""

from __future__ import annotations

import argparse
import json

import pytest
from hsextract.cli import main
from hsextract.client.command import add_arguments, config_from_args
from hsextract.config_file import apply_config
from hsextract.shard import Shard


def _config(tmp_path, *argv: str, shard: str | None = None):
    """The ExtractConfig the command would run with, from a run config file (as the unit has) and flags."""
    run = {
        "server": "http://127.0.0.1:9",
        "dataset": str(tmp_path / "d.jsonl"),
        "model": str(tmp_path / "m"),
        "dump_dir": str(tmp_path / "dump"),
        "output": str(tmp_path / "out"),
        "format": "specforge",
    }
    if shard:
        run["shard"] = shard
    (tmp_path / "run.json").write_text(json.dumps(run))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    rest = ["--config", str(tmp_path / "run.json"), *argv]
    return config_from_args(apply_config(parser, parser.parse_args(rest), rest))


def test_process_narrows_the_config_files_shard_to_its_sub_shard(tmp_path):
    assert _config(tmp_path, "--process", "1/4", shard="2/3").shard == Shard(5, 12)


def test_process_narrows_the_shard_given_as_a_flag(tmp_path):
    assert _config(tmp_path, "--shard", "1/2", "--process", "1/2").shard == Shard(3, 4)


def test_process_of_the_whole_dataset_is_every_pth_sample(tmp_path):
    assert _config(tmp_path, "--process", "0/3").shard == Shard(0, 3)


def test_without_process_the_shard_is_unchanged(tmp_path):
    assert _config(tmp_path, shard="1/2").shard == Shard(1, 2)


@pytest.mark.parametrize(
    ("value", "why"), [("2/2", "0 <= j < P=2, got j=2"), ("0/0", "P >= 1"), ("one", "expected j/P")]
)
def test_a_bad_process_is_refused_before_anything_starts_naming_the_option(capsys, tmp_path, value, why):
    code = main(
        [
            "extract",
            "--server",
            "http://127.0.0.1:9",
            "--dataset",
            str(tmp_path / "d.jsonl"),
            "--model",
            str(tmp_path / "m"),
            "--dump-dir",
            str(tmp_path / "dump"),
            "--output",
            str(tmp_path / "out"),
            "--format",
            "specforge",
            "--shard",
            "1/2",
            "--process",
            value,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--process (of shard 1/2)" in err and why in err
    assert not (tmp_path / "out").exists(), "nothing is written before the setup is known to be usable"


def test_the_help_says_why_several_processes(capsys):
    with pytest.raises(SystemExit):
        main(["extract", "--help"])
    assert "--process J/P" in capsys.readouterr().out
