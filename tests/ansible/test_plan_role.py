"""The plan role runs `hsextract plan` on the run config and stops the play when the output volume
is too small, naming the numbers and the variables to change. Runs on the host (the role only
reads the dataset and writes its report), with the real ml-env interpreter and the tiny model.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support import ansiballz_cache

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def ansible_bin() -> Path:
    bin_dir = os.environ.get("HSEXTRACT_ANSIBLE_BIN")
    if not bin_dir or not os.environ.get("HSEXTRACT_PYTHON"):
        pytest.skip("$HSEXTRACT_ANSIBLE_BIN / $HSEXTRACT_PYTHON are not set (make test sets them)")
    return Path(bin_dir)


def run_role(tmp_path: Path, config: Path, **extra) -> subprocess.CompletedProcess:
    playbook = tmp_path / "plan.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  roles:\n    - plan\n")
    variables = {
        "plan_python": os.environ["HSEXTRACT_PYTHON"],
        "plan_config_file": str(config),
        "plan_report": str(tmp_path / "plan.json"),
        "ansible_python_interpreter": str(ansible_bin() / "python"),
        **extra,
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
            str(playbook),
            "-e",
            json.dumps(variables),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def config(tmp_path, tiny_llama) -> Path:
    """A run config as roles/hsextract writes it."""
    path = tmp_path / "run.json"
    path.write_text(
        json.dumps(
            {
                "model": str(tiny_llama),
                "dataset": str(REPO / "files" / "datasets" / "demo.jsonl"),
                "output": str(tmp_path / "output"),
                "dump_dir": "/dev/shm/hsextract-plan-role-test",
                "format": "specforge",
                "aux_layers": "",
                "max_in_flight": 8,
                "max_tokens": 4096,
                "overlong": "truncate",
                "shm_min_free": "10%",
                "max_staged": 64,
                "final_hidden": "post_norm",
                "rid_prefix": "hsx",
                "server": "http://127.0.0.1:30000",
            }
        )
    )
    return path


def test_the_plan_reports_the_run_and_changes_nothing(tmp_path, config):
    r = run_role(tmp_path, config)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "changed=0" in r.stdout and "failed=0" in r.stdout
    report = json.loads((tmp_path / "plan.json").read_text())
    assert report["samples"] == 40 and report["format"] == "specforge" and report["output_volume"]["ok"]
    assert "samples   40 of 40 rows" in r.stdout


def test_a_volume_too_small_stops_the_play_with_the_numbers(tmp_path, config):
    r = run_role(tmp_path, config, plan_space_margin="1000T")
    assert r.returncode != 0
    assert "but the run needs" in r.stdout and "specforge training set" in r.stdout
    assert "plan_space_margin" in r.stdout and "exit status 5" in r.stdout
    assert json.loads((tmp_path / "plan.json").read_text())["output_volume"]["ok"] is False
    relaxed = run_role(tmp_path, config, plan_space_margin="1000T", plan_enforce_space=False)
    assert relaxed.returncode == 0, relaxed.stdout[-3000:]
