"""The service handlers read every unit's state with one `systemctl show`, and restart what runs.

Its output is parsed by the role's own vars (`roles/service_handlers/vars/main.yml`) under the
controller's real Ansible; the outputs below are systemd 252's, as the sandbox printed them for a
missing unit, a running one and a template unit's pattern (one block per loaded instance)."""

from __future__ import annotations

import json
import subprocess

import pytest
from support.ansible_env import ansible_bin
from support.playbook_sandbox import REPO

pytestmark = pytest.mark.slow

VARS = REPO / "roles" / "service_handlers" / "vars" / "main.yml"
SHOWN = (
    "Id=hsextract-server.service\nActiveState=activating\n\n"
    "Id=hsextract-drain.service\nActiveState=inactive\n\n"
    "Id=hsextract-regenerate.service\nActiveState=inactive\n\n"
    "Id=hsextract-extract@0.service\nActiveState=failed\n\n"
    "Id=hsextract-extract@1.service\nActiveState=active\n"
)


def handler_states(tmp_path, client_unit: str, shown: str) -> dict:
    out = tmp_path / "states.json"
    read = "{{ {'states': service_handlers__states, 'client': service_handlers__client_states} | to_json }}"
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars_files": [str(VARS)],
            "vars": {"service_handlers_client_unit": client_unit, "service_handlers__shown": {"stdout": shown}},
            "tasks": [
                {
                    "name": "Write what the handlers would read.",
                    "ansible.builtin.copy": {"dest": str(out), "mode": "0644", "content": read},
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    bin_dir = ansible_bin()
    r = subprocess.run(
        [
            str(bin_dir / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={bin_dir / 'python'}",
            str(tmp_path / "play.yml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text())


def test_each_unit_shown_is_read_with_its_state(tmp_path):
    states = handler_states(tmp_path, "hsextract-extract.service", SHOWN)["states"]
    assert states["hsextract-server.service"] == "activating"
    assert states["hsextract-drain.service"] == "inactive"
    assert len(states) == 5


@pytest.mark.parametrize(
    ("client_unit", "expected"),
    [
        ("hsextract-extract@*.service", ["failed", "active"]),  # several processes: every instance
        ("hsextract-extract.service", []),  # one process, its unit not shown: not running
    ],
)
def test_the_client_states_are_its_units_or_every_instance_of_its_pattern(tmp_path, client_unit, expected):
    assert handler_states(tmp_path, client_unit, SHOWN)["client"] == expected


def test_nothing_shown_reads_as_no_unit_running(tmp_path):
    assert handler_states(tmp_path, "hsextract-extract@*.service", "") == {"states": {}, "client": []}
