"""The run configuration file every subcommand reads (``--config``): a key no subcommand reads is
refused with its name, where it stands and the nearest known key, never ignored silently."""

from __future__ import annotations

import argparse
import importlib
import json
import re

import pytest
from hsextract.cli import COMMANDS, main
from hsextract.config_keys import KNOWN_KEYS
from support.drain_proc import REPO


def _keys_of_every_subcommand_that_reads_a_config() -> set[str]:
    keys: set[str] = set()
    for module_name, _ in COMMANDS.values():
        parser = argparse.ArgumentParser()
        importlib.import_module(module_name).add_arguments(parser)
        dests = {a.dest for a in parser._actions}
        if "config" in dests:
            keys |= dests - {"help", "config"}
    return keys


@pytest.mark.slow  # imports every subcommand (collect's take torch)
def test_the_known_keys_are_the_options_of_every_subcommand_that_reads_a_config():
    assert set(KNOWN_KEYS) == _keys_of_every_subcommand_that_reads_a_config()


def test_a_misspelt_key_is_refused_with_its_line_and_the_nearest_known_key(tmp_path, capsys):
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"_comment": "by hand", "output": str(tmp_path / "o"), "uplods": 4}, indent=2))
    code = main(["finalize", "--config", str(cfg)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"config file {cfg} line 4: unknown key 'uplods' (did you mean 'uploads'?)" in err, err


def test_a_key_with_nothing_near_it_is_refused_by_name(tmp_path, capsys):
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"bogus_key": 1}))
    assert main(["status", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'bogus_key' (no known key is near it)" in err, err


def test_a_key_another_subcommand_reads_is_accepted_in_the_shared_file(tmp_path, capsys):
    """The roles write one file for the client, the drain and the rest: the drain's ``uploads`` in
    it is no concern of ``status``."""
    cfg = tmp_path / "run.json"
    out = tmp_path / "out"
    out.mkdir()
    cfg.write_text(json.dumps({"output": str(out), "uploads": 4, "server": "http://127.0.0.1:9"}))
    main(["status", "--config", str(cfg)])
    assert "unknown key" not in capsys.readouterr().err


def test_the_roles_run_config_keys_are_all_known():
    """Every key the hsextract role writes into the run config (templates/run.json.j2) is one some
    subcommand reads: the file the units pass with --config is never refused."""
    text = (REPO / "roles" / "hsextract" / "templates" / "run.json.j2").read_text()
    written = set(re.findall(r'"([a-z0-9_]+)":', text))
    assert {"server", "dump_dir", "work_dir", "s3_credentials", "shard"} <= written, "the template's keys were found"
    assert {k for k in written if not k.startswith("_")} <= KNOWN_KEYS
