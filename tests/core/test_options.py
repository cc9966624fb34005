"""A command's options are declared once, as fields of its settings (hsextract.options): the field
gives the flag, its default, its help and the value the command runs with."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest
from hsextract.config_file import add_config_argument, apply_config
from hsextract.options import add_options, missing_options, option, options_from


@dataclass
class Settings:
    dump_dir: Path = option(help="where dumps are staged", convert=Path)
    memory_budget_bytes: int = option(2 << 30, flag="--memory-budget", type=int, help="bytes held at once")
    workers: int = option(4, type=int, parser_default=None, help="writers (default: one per core)")
    exit_when_done: bool = option(False, action="store_true", help="exit once the run is done")
    format: str = option("speculators", group="run", choices=("specforge", "speculators"), required=True)
    status_every_s: float = 1.0  # not a flag


def _parse(argv: list[str], config: Path | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cmd")
    add_options(parser, Settings)
    add_config_argument(parser)
    if config is not None:
        argv = [*argv, "--config", str(config)]
    return apply_config(parser, parser.parse_args(argv), argv)


def test_a_field_gives_its_flag_its_help_and_its_default():
    parser = argparse.ArgumentParser(prog="cmd")
    add_options(parser, Settings)
    text = parser.format_help()
    assert "--dump-dir DUMP_DIR" in text and "where dumps are staged" in text
    assert "--memory-budget MEMORY_BUDGET" in text and "--status-every" not in text
    assert "run:\n  --format {specforge,speculators}" in text
    assert vars(parser.parse_args([]))["memory_budget"] == 2 << 30


def test_the_settings_hold_the_flags_values_converted_and_the_fields_defaults_where_not_given():
    s = options_from(Settings, _parse(["--dump-dir", "/d", "--memory-budget", "7", "--exit-when-done"]))
    assert s == Settings(dump_dir=Path("/d"), memory_budget_bytes=7, workers=4, exit_when_done=True)


def test_what_the_command_derives_wins_over_the_flag():
    s = options_from(Settings, _parse(["--dump-dir", "/d", "--workers", "2"]), workers=9)
    assert s.workers == 9


def test_the_config_files_keys_are_the_flags_names(tmp_path):
    config = tmp_path / "run.json"
    config.write_text('{"dump_dir": "/c", "memory_budget": 5, "format": "specforge"}')
    s = options_from(Settings, _parse(["--memory-budget", "6"], config))
    assert (s.dump_dir, s.memory_budget_bytes, s.format) == (Path("/c"), 6, "specforge")


def test_the_flags_a_command_needs_are_named_when_missing():
    assert missing_options(Settings, _parse([])) == ["--dump-dir", "--format"]
    assert missing_options(Settings, _parse(["--dump-dir", "/d", "--format", "specforge"])) == []


@dataclass(kw_only=True)
class Capture:
    model_path: str = option(flag="--model", aliases=("--model-path",), dest="model", help="model directory")
    architecture: str = option(required=False, help="default: the model's")  # the command derives it
    layers: list[str] = option(default_factory=list, positional=True, nargs="*", metavar="LAYER")


@dataclass
class Render:
    out_dir: str = option(help="where to render")
    capture: Capture = option(nested=Capture)
    link: bool = option(False, action="store_true", exclusive="how")
    move: bool = option(False, action="store_true", exclusive="how")


def _parser(cls: type) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cmd")
    add_options(parser, cls)
    return parser


def test_a_nested_settings_class_gives_its_flags_in_its_place_and_is_built_from_them():
    text = _parser(Render).format_help()
    assert text.index("--out-dir") < text.index("--model MODEL") < text.index("--link")
    args = _parser(Render).parse_args(["--out-dir", "/o", "--model", "/m", "--architecture", "Llama", "1", "2"])
    assert options_from(Render, args) == Render(
        out_dir="/o", capture=Capture(model_path="/m", architecture="Llama", layers=["1", "2"])
    )


def test_an_older_spelling_of_a_flag_is_still_accepted():
    args = _parser(Render).parse_args(["--model-path", "/m"])
    assert options_from(Capture, args, architecture="Llama").model_path == "/m"
    assert "--model MODEL, --model-path MODEL" in _parser(Render).format_help()


def test_a_flag_the_command_derives_is_not_needed_though_its_field_has_no_default():
    assert missing_options(Render, _parser(Render).parse_args([])) == ["--out-dir", "--model"]


def test_flags_that_exclude_each_other_are_refused_together(capsys):
    assert "[--link | --move]" in _parser(Render).format_usage()
    with pytest.raises(SystemExit):
        _parser(Render).parse_args(["--out-dir", "/o", "--link", "--move"])
    assert "not allowed with argument" in capsys.readouterr().err
