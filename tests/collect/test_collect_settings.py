"""What ``hsextract collect`` runs with, from its flags: its options are declared once, as the fields
of `CollectConfig` (hsextract.options), and each command line below gives, field by field, the settings
the command built when every option was spelled three times (a flag, a field, the line between them)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hsextract.collect.command import add_arguments, config_from_args
from hsextract.collect.config import DEFAULT_WORKERS, CollectConfig
from hsextract.errors import ConfigError


def _settings(*argv: str) -> CollectConfig:
    parser = argparse.ArgumentParser(prog="hsextract collect")
    add_arguments(parser)
    return config_from_args(parser.parse_args(argv))


# The settings as the runner reads them (the transfer's mode among them).
READ = (
    "into",
    "hosts",
    "mode",
    "final",
    "wait_for_space_s",
    "workers",
    "draft_vocab_sizes",
    "vocab_size",
    "stale_after_s",
)


def _fields(cfg: CollectConfig) -> dict:
    return {name: getattr(cfg, name) for name in READ}


def test_hosts_and_into_alone_leave_every_other_setting_at_its_default():
    assert _fields(_settings("--into", "/c", "a=/h/a", "/h/b")) == {
        "into": Path("/c"),
        "hosts": [("a", Path("/h/a")), ("b", Path("/h/b"))],
        "mode": "copy",
        "final": False,
        "wait_for_space_s": 0.0,
        "workers": DEFAULT_WORKERS,
        "draft_vocab_sizes": (32000,),
        "vocab_size": None,
        "stale_after_s": 60.0,
    }


def test_every_flag_given_is_the_setting_it_names():
    cfg = _settings(
        "--into", "/c", "--link", "--final", "--wait-for-space", "30", "--workers", "3", "--stale-after", "5",
        "h1=/a", "--draft-vocab-size", "1000", "2000", "--vocab-size", "50000",
    )  # fmt: skip
    assert _fields(cfg) == {
        "into": Path("/c"),
        "hosts": [("h1", Path("/a"))],
        "mode": "link",
        "final": True,
        "wait_for_space_s": 30.0,
        "workers": 3,
        "draft_vocab_sizes": (1000, 2000),
        "vocab_size": 50000,
        "stale_after_s": 5.0,
    }


def test_move_without_a_draft_vocabulary_and_a_wait_below_zero_taken_as_none():
    cfg = _settings("--into", "/c", "--move", "--wait-for-space", "-5", "--no-draft-vocab", "/a", "/b")
    assert (cfg.mode, cfg.wait_for_space_s, cfg.draft_vocab_sizes) == ("move", 0.0, None)
    assert cfg.hosts == [("a", Path("/a")), ("b", Path("/b"))]


def test_without_into_or_with_no_worker_the_collect_is_refused_naming_the_flag():
    with pytest.raises(ConfigError, match="collect needs --into DIR, the collected set's directory"):
        _settings("/a", "/b")
    with pytest.raises(ConfigError, match="--workers 0: give at least 1"):
        _settings("--into", "/c", "--workers", "0", "/a")


def test_link_and_move_are_refused_together(capsys):
    with pytest.raises(SystemExit):
        _settings("--into", "/c", "--link", "--move", "/a")
    assert "argument --move: not allowed with argument --link" in capsys.readouterr().err
