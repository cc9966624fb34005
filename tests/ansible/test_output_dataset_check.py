"""Switching hsextract_regenerate on or off for an output directory that already holds a training set
of the other dataset stops the play at its first role, before hours of regeneration, naming both
datasets and the fix.

The client itself refuses such a resume (tests/client/test_output_dataset_identity.py), but only
when it starts, after the regeneration. The output's record is written here by the client's own
code; the roles/hsextract role runs on this host in check mode, so nothing is installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from hsextract.output.dataset_record import check_and_record
from support import ansiballz_cache
from support.ansible_env import ansible_bin

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def host(tmp_path, tiny_llama) -> dict:
    """A source dataset, its regenerated dataset, and the settings of a play that reads them."""
    source = tmp_path / "data" / "source.jsonl"
    source.parent.mkdir()
    source.write_text(
        json.dumps(
            {
                "id": "a",
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "source reply"}],
            }
        )
        + "\n"
    )
    regenerated = tmp_path / "regenerated"
    regenerated.mkdir()
    (regenerated / "conversations.jsonl").write_text(source.read_text().replace("source reply", "model's reply"))
    settings = {
        "hsextract_model_path": str(tiny_llama),
        "hsextract_dataset": str(source),
        "hsextract_regenerated_dir": str(regenerated),
        "hsextract_output_dir": str(tmp_path / "output"),
        "hsextract_state_dir": str(tmp_path / "state"),
        "hsextract_config_dir": str(tmp_path / "etc"),
        "hsextract_dump_dir": str(tmp_path / "dump"),
        "hsextract_format": "specforge",
    }
    return {
        "tmp": tmp_path,
        "source": source,
        "regenerated": regenerated,
        "output": tmp_path / "output",
        "settings": settings,
    }


def check_play(host: dict, regenerate: bool) -> subprocess.CompletedProcess:
    """The hsextract role (the first of extract.yml) in check mode on this host."""
    tmp = host["tmp"]
    (tmp / "play.yml").write_text("- hosts: localhost\n  gather_facts: false\n  roles:\n    - hsextract\n")
    variables = {
        **host["settings"],
        "hsextract_regenerate": regenerate,
        "ansible_python_interpreter": str(ansible_bin() / "python"),
    }
    env = ansiballz_cache.with_cache(
        {
            **os.environ,
            "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCALHOST_WARNING": "0",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
        }
    )
    return subprocess.run(
        [
            str(ansible_bin() / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "--check",
            "play.yml",
            "-e",
            json.dumps(variables),
        ],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_regenerating_into_an_output_of_the_source_dataset_stops_the_play_naming_both(host):
    check_and_record(host["output"], host["source"], has_samples=True)
    r = check_play(host, regenerate=True)
    assert r.returncode != 0, r.stdout[-3000:]
    assert "Check that switching the regeneration on or off" in r.stdout
    assert f"holds a training set extracted from {host['source']}" in r.stdout, r.stdout[-3000:]
    assert f"the extraction reads {host['regenerated']} (expected: the set's dataset is the one" in r.stdout
    assert "Set hsextract_output_dir to a new directory" in r.stdout
    assert "Look for a GPU." not in r.stdout, "the play went on past the settings' checks"


def test_switching_the_regeneration_off_for_an_output_of_the_regenerated_dataset_stops_the_play(host):
    check_and_record(host["output"], host["regenerated"], has_samples=True)
    r = check_play(host, regenerate=False)
    assert r.returncode != 0, r.stdout[-3000:]
    assert f"holds a training set extracted from {host['regenerated']}" in r.stdout, r.stdout[-3000:]
    assert f"the extraction reads {host['source']}" in r.stdout
    assert "or hsextract_regenerate back to True" in r.stdout


def test_regenerating_into_an_output_of_the_regenerated_dataset_goes_on_in_check_mode(host):
    check_and_record(host["output"], host["regenerated"], has_samples=True)
    r = check_play(host, regenerate=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "failed=0" in r.stdout and "Write the run config that every hsextract subcommand reads." in r.stdout
    checked = re.search(r"TASK \[hsextract : Check that switching the regeneration on or off[^\n]*\n(\w+):", r.stdout)
    assert checked and checked[1] == "ok", "the check did not run on the recorded dataset"
