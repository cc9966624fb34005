"""Run a role's tasks with Ansible on this machine (local connection), for tests of what a role
refuses or renders: ``playbook`` writes an inventory and a play into a directory and runs it (one
host per case, run in parallel); ``validate`` includes one role in check mode after the run's
settings, so its argument specs and its first checks run and nothing is installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from support import ansiballz_cache
from support.ansible_env import ansible_bin

ROLES = Path(__file__).resolve().parents[2] / "roles"
# The run settings a role needs before it can start (the rest are the hsextract role's defaults).
RUN_SETTINGS = {"hsextract_on_cpu": True, "hsextract_model_path": "/models/m", "hsextract_dataset": "/data/d.jsonl"}


def playbook(
    tmp: Path, plays: list[dict], hosts: dict[str, dict], *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run `plays` on `hosts` (name -> its variables) from `tmp`; `args` go to ansible-playbook, `env`
    adds to its environment (a callback, filter plugins)."""
    python = str(ansible_bin() / "python")
    (tmp / "inventory.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {
                        name: {"ansible_connection": "local", "ansible_python_interpreter": python, **vars_}
                        for name, vars_ in hosts.items()
                    }
                }
            }
        )
    )
    (tmp / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    environment = ansiballz_cache.with_cache(
        {
            **os.environ,
            "ANSIBLE_ROLES_PATH": str(ROLES),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCALHOST_WARNING": "0",
            "ANSIBLE_FORKS": str(len(hosts)),
            **(env or {}),
        }
    )
    return subprocess.run(
        [str(ansible_bin() / "ansible-playbook"), "-i", "inventory.yml", "play.yml", *args],
        cwd=tmp,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )


def validate(tmp: Path, role: str, variables: dict) -> subprocess.CompletedProcess:
    """Include the role with these variables in check mode: its argument specs run first."""
    (tmp / "settings.yml").write_text(yaml.safe_dump({**RUN_SETTINGS, **variables}))
    plays = [
        {
            "name": "Validate the role's arguments.",
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Import the run's settings.",
                    "ansible.builtin.import_role": {"name": "hsextract", "tasks_from": "settings"},
                },
                {"name": "Load the settings.", "ansible.builtin.include_vars": str(tmp / "settings.yml")},
                {"name": "Include the role.", "ansible.builtin.include_role": {"name": role}},
            ],
        }
    ]
    return playbook(tmp, plays, {"localhost": {}}, "--check")
