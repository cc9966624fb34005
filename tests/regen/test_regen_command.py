"""``hsextract regenerate`` refuses a broken setup at once, with a message that says what and where."""

from __future__ import annotations

import json

from hsextract.cli import main


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(["regenerate", *argv])
    return code, capsys.readouterr().err


def test_missing_required_settings_are_named(capsys):
    code, err = _run(capsys, "--model", "/m")
    assert code == 2 and "--dataset" in err and "--output" in err and "--server" in err


def test_missing_dataset_stops_at_once_naming_it(capsys, tmp_path):
    code, err = _run(
        capsys,
        "--server",
        "http://127.0.0.1:9",
        "--dataset",
        str(tmp_path / "absent.jsonl"),
        "--output",
        str(tmp_path / "out"),
    )
    assert code == 2 and "absent.jsonl does not exist" in err
    assert not (tmp_path / "out").exists(), "nothing is written before the setup is known to be usable"


def test_an_empty_dataset_file_stops_at_once_as_an_empty_directory_does(capsys, tmp_path):
    (tmp_path / "d.jsonl").write_bytes(b"")
    code, err = _run(
        capsys,
        "--server",
        "http://127.0.0.1:9",
        "--dataset",
        str(tmp_path / "d.jsonl"),
        "--output",
        str(tmp_path / "out"),
    )
    assert code == 2 and "d.jsonl is empty (0 bytes)" in err
    assert not (tmp_path / "out").exists()


def test_output_inside_the_dataset_directory_is_refused(capsys, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    code, err = _run(
        capsys,
        "--server",
        "http://127.0.0.1:9",
        "--dataset",
        str(tmp_path / "data"),
        "--output",
        str(tmp_path / "data" / "regen"),
    )
    assert code == 2 and "inside the dataset" in err


def test_config_file_gives_the_server_and_a_shared_output_key_is_not_taken_for_the_regenerated_one(capsys, tmp_path):
    cfg = tmp_path / "run.json"
    cfg.write_text(
        json.dumps(
            {
                "server": "http://127.0.0.1:9",
                "dataset": str(tmp_path / "absent.jsonl"),
                "output": str(tmp_path / "training-set"),
            }
        )
    )
    code, err = _run(capsys, "--config", str(cfg))
    assert code == 2 and "--output" in err and "--server" not in err
