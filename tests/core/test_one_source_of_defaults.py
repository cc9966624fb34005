"""The client's defaults, the Ansible roles' and those of every subcommand that sizes a client run
are one set of numbers.

`hsextract.dataset.defaults` is the source: `ExtractConfig` and the CLI's flags take their
defaults from it, the roles' public interface (roles/hsextract/defaults/main.yml and its argument
specs) must say the same, or a run started by hand would behave otherwise than one started by
the play; and ``plan`` and ``check-shm``, which size the client's run, must assume the client's
own limits when they are not told others.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest
import yaml
from hsextract.client.config import ExtractConfig
from hsextract.dataset import defaults
from hsextract.options import default_of, required_keys

REPO = Path(__file__).resolve().parents[2]


def _default(name: str):
    return default_of(ExtractConfig, name)


# role variable -> the ExtractConfig value it must equal
SHARED = {
    "hsextract_max_in_flight": lambda: _default("max_in_flight"),
    "hsextract_max_staged": lambda: _default("max_staged"),
    "hsextract_max_tokens": lambda: defaults.MAX_TOKENS,
    "hsextract_max_row_bytes": lambda: _default("max_row_bytes"),
    "hsextract_overlong": lambda: _default("overlong"),
    "hsextract_shm_min_free": lambda: str(_default("shm_min_free")),
    "hsextract_rid_prefix": lambda: _default("rid_prefix"),
}


def _role(path: str) -> dict:
    return yaml.safe_load((REPO / "roles" / "hsextract" / path).read_text())


def test_the_roles_defaults_equal_the_clients():
    defaults = _role("defaults/main.yml")
    differ = {k: (defaults.get(k), want()) for k, want in SHARED.items() if defaults.get(k) != want()}
    assert not differ, f"role default vs client default: {differ}"


def test_the_argument_specs_state_the_same_defaults():
    options = _role("meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    differ = {
        k: (options[k].get("default"), want())
        for k, want in SHARED.items()
        if "default" in options.get(k, {}) and options[k]["default"] != want()
    }
    assert not differ, f"argument spec default vs client default: {differ}"


def _flag_defaults(module: str) -> dict:
    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    return vars(parser.parse_args([]))


def test_the_cli_takes_its_defaults_from_the_config():
    args = _flag_defaults("hsextract.client.command")
    assert (
        args["max_in_flight"],
        args["max_staged"],
        args["overlong"],
        args["rid_prefix"],
        args["max_row_bytes"],
        args["shm_min_free"],
    ) == (
        _default("max_in_flight"),
        _default("max_staged"),
        _default("overlong"),
        _default("rid_prefix"),
        _default("max_row_bytes"),
        str(_default("shm_min_free")),
    )


@pytest.mark.parametrize("module", ["hsextract.plan.command", "hsextract.ops.check_shm"])
def test_plan_and_check_shm_assume_the_clients_limits(module):
    """Every flag they share with ``extract`` (but the settings a run must be given) defaults as the client's."""
    client = _flag_defaults("hsextract.client.command")
    other = _flag_defaults(module)
    shared = sorted(set(client) & set(other) - set(required_keys(ExtractConfig)) - {"config"})
    assert {"max_in_flight", "max_staged", "shm_min_free", "max_tokens"} <= set(shared)
    differ = {k: (other[k], client[k]) for k in shared if other[k] != client[k]}
    assert not differ, f"{module} default vs the client's: {differ}"
