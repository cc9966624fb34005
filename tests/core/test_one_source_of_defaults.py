"""The client's defaults and the Ansible roles' defaults are one set of numbers.

`ExtractConfig` (hsextract/client/runner.py) is the source: the CLI's flags take their defaults
from it, and the roles' public interface (roles/hsextract/defaults/main.yml and its argument
specs) must say the same, or a run started by hand would behave otherwise than one started by
the play.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from hsextract.client.command import _default
from hsextract.client.runner import DEFAULT_MAX_TOKENS

REPO = Path(__file__).resolve().parents[2]

# role variable -> the ExtractConfig value it must equal
SHARED = {
    "hsextract_max_in_flight": lambda: _default("max_in_flight"),
    "hsextract_max_staged": lambda: _default("max_staged"),
    "hsextract_max_tokens": lambda: DEFAULT_MAX_TOKENS,
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
    differ = {k: (options[k].get("default"), want()) for k, want in SHARED.items()
              if "default" in options.get(k, {}) and options[k]["default"] != want()}
    assert not differ, f"argument spec default vs client default: {differ}"


def test_the_cli_takes_its_defaults_from_the_config():
    import argparse

    from hsextract.client.command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    assert (args.max_in_flight, args.max_staged, args.overlong, args.rid_prefix) == (
        _default("max_in_flight"), _default("max_staged"), _default("overlong"), _default("rid_prefix"))
