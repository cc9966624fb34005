"""The server unit's two profiles, and the argument specs of the roles that choose them.

The capture profile is the extraction's server (radix cache off, the capture package loaded,
prefill CUDA graphs off on a GPU); the generation profile is regeneration's (radix cache on, no
capture package, CUDA graphs as SGLang sets them). Units are rendered by Ansible from the roles'
own templates and defaults; nothing is installed (the argument-spec cases run in check mode).
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
import yaml
from hsextract.capture.patch import server_launch
from support.role_play import playbook, validate

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"
SERVER_TEMPLATE = ROLES / "sglang_server" / "templates" / "hsextract-server.service.j2"
CAPTURE_DIR = "/var/lib/hsextract/capture-patch"
STUBS_DIR = "/opt/hsextract/venv/cpu-stubs"

BASE = {"hsextract_on_cpu": False, "hsextract_model_path": "/models/m", "hsextract_dataset": "/data/d.jsonl"}
# case -> variables; each case renders the server unit once
CASES = {
    "gpu-default": {"sglang_server_cpu": False},
    "gpu-capture": {"sglang_server_cpu": False, "sglang_server_profile": "capture"},
    "gpu-generation": {"sglang_server_cpu": False, "sglang_server_profile": "generation"},
    "cpu-capture": {"sglang_server_cpu": True, "sglang_server_profile": "capture"},
    "cpu-generation": {"sglang_server_cpu": True, "sglang_server_profile": "generation"},
    "gpu-generation-parsers": {
        "sglang_server_cpu": False,
        "sglang_server_profile": "generation",
        "sglang_server_reasoning_parser": "kimi_k2",
        "sglang_server_tool_call_parser": "kimi_k2",
    },
}


@pytest.fixture(scope="module")
def units(tmp_path_factory) -> dict[str, str]:
    """case -> the server unit Ansible renders for it."""
    tmp = tmp_path_factory.mktemp("server-profiles")
    defaults = [str(ROLES / role / "defaults" / "main.yml") for role in ("hsextract", "sglang_server")]
    plays = [
        {
            "name": "Render the server unit of every case.",
            "hosts": "all",
            "gather_facts": False,
            "vars_files": defaults,
            "tasks": [
                # include_vars outranks the vars files: the case's settings win over the roles' defaults.
                {
                    "name": "Load the case's settings.",
                    "ansible.builtin.include_vars": str(tmp / "case-{{ inventory_hostname }}.yml"),
                },
                {
                    "name": "Render the unit.",
                    "ansible.builtin.template": {
                        "src": str(SERVER_TEMPLATE),
                        "dest": str(tmp / "{{ inventory_hostname }}"),
                        "mode": "0644",
                    },
                },
            ],
        }
    ]
    for case, settings in CASES.items():
        (tmp / f"case-{case}.yml").write_text(yaml.safe_dump({**BASE, **settings}))
    r = playbook(tmp, plays, {case: {} for case in CASES})
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
    return {case: (tmp / case).read_text() for case in CASES}


def exec_start(unit: str) -> list[str]:
    line = unit.replace("\\\n", " ").split("ExecStart=", 1)[1].splitlines()[0]
    return shlex.split(line)


def environment(unit: str) -> dict[str, str]:
    return dict(line.split("=", 1)[1].split("=", 1) for line in unit.splitlines() if line.startswith("Environment="))


def test_the_capture_profile_is_the_default(units):
    assert units["gpu-default"] == units["gpu-capture"]


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_the_capture_profile_has_every_flag_and_variable_the_capture_needs(units, device):
    unit = units[f"{device}-capture"]
    launch = server_launch(CAPTURE_DIR, device="cuda" if device == "gpu" else "cpu")
    argv, env = exec_start(unit), environment(unit)
    flags = " ".join(argv)
    for i, arg in enumerate(launch.args):
        if arg.startswith("--"):
            value = launch.args[i + 1] if i + 1 < len(launch.args) and not launch.args[i + 1].startswith("--") else ""
            assert f"{arg} {value}".strip() in flags, f"{arg} {value} missing from {flags}"
    assert env["SGLANG_EXTERNAL_MODEL_PACKAGE"] == launch.env["SGLANG_EXTERNAL_MODEL_PACKAGE"]
    assert CAPTURE_DIR in env["PYTHONPATH"].split(":")
    assert "(capture on)" in unit and "--reasoning-parser" not in argv and "--tool-call-parser" not in argv


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_the_generation_profile_has_the_radix_cache_on_and_no_capture(units, device):
    unit = units[f"{device}-generation"]
    argv, env = exec_start(unit), environment(unit)
    assert "--disable-radix-cache" not in argv
    assert "--disable-prefill-cuda-graph" not in argv
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE" not in env
    assert CAPTURE_DIR not in env.get("PYTHONPATH", "") and CAPTURE_DIR not in unit
    assert "/dev/shm/hsextract" not in unit, "the generation server stages nothing"
    if device == "cpu":
        assert env["PYTHONPATH"] == STUBS_DIR and env["SGLANG_USE_CPU_ENGINE"] == "1"
        assert {"--disable-cuda-graph", "torch_native"} <= set(argv)
    else:
        assert "PYTHONPATH" not in env and "--disable-cuda-graph" not in argv


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_the_profiles_differ_only_in_the_capture_settings(units, device):
    capture, generation = exec_start(units[f"{device}-capture"]), exec_start(units[f"{device}-generation"])
    assert [a for a in capture if a not in ("--disable-radix-cache", "--disable-prefill-cuda-graph")] == generation


def test_the_parsers_are_passed_only_when_set(units):
    argv = exec_start(units["gpu-generation-parsers"])
    assert argv[argv.index("--reasoning-parser") + 1] == "kimi_k2"
    assert argv[argv.index("--tool-call-parser") + 1] == "kimi_k2"
    assert [a for a in argv if "parser" not in a and a != "kimi_k2"] == exec_start(units["gpu-generation"])


# ---- argument specs ----------------------------------------------------------------------------------


def test_the_argument_specs_refuse_an_unknown_server_profile(tmp_path):
    r = validate(tmp_path, "sglang_server", {"sglang_server_profile": "decode"})
    assert r.returncode != 0
    assert "sglang_server_profile" in r.stdout and "decode" in r.stdout and "capture, generation" in r.stdout, r.stdout


def test_the_argument_specs_refuse_an_unknown_reasoning_mode(tmp_path):
    r = validate(tmp_path, "regeneration", {"regeneration_reasoning": "hide"})
    assert r.returncode != 0
    assert "regeneration_reasoning" in r.stdout and "strip-history" in r.stdout, r.stdout


def test_the_regeneration_role_does_nothing_unless_switched_on(tmp_path):
    r = validate(tmp_path, "regeneration", {})
    assert r.returncode == 0, r.stdout[-3000:]
    # both of its tasks (the summary's lookup, the regeneration) are skipped
    assert re.search(r"changed=0 .* failed=0 .* skipped=2 ", r.stdout), r.stdout[-3000:]


# ---- one source of the regeneration's defaults --------------------------------------------------------


def test_the_regeneration_roles_defaults_are_the_clis():
    from hsextract.regen.command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cli = vars(parser.parse_args([]))
    defaults = yaml.safe_load((ROLES / "regeneration" / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLES / "regeneration" / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    for flag in (
        "temperature",
        "top_p",
        "top_k",
        "max_new_tokens",
        "reasoning",
        "last_turn_only",
        "drop_truncated",
        "concurrency",
    ):
        name = f"regeneration_{flag}"
        assert defaults[name] == cli[flag], f"{name}: role {defaults[name]!r}, CLI {cli[flag]!r}"
        assert options[name].get("default") == cli[flag], f"{name}: argument spec {options[name].get('default')!r}"
    own = sorted(name for name in options if name.startswith("regeneration_"))  # the others: the run's settings
    assert sorted(defaults) == own, "the defaults and the argument specs list other variables"
