"""The fleet role on the controller: each host's shard from its place in the group, and the
inventories that cannot make one training set, refused on every host before any host is
contacted (the role runs no module on a host, so the hosts here need not exist)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from support import ansiballz_cache

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PLAY = """- hosts: all
  gather_facts: false
  tasks:
    - {ansible.builtin.import_role: {name: hsextract, tasks_from: settings}}
    - {ansible.builtin.import_role: {name: fleet}}
    - {name: Show the shard., ansible.builtin.debug: {msg: "{{ fleet_shard }}"}}
"""


def at(*addresses: str) -> dict[str, dict]:
    """Hosts h1, h2... at these addresses (of RFC 2544's test range; never contacted)."""
    return {f"h{k + 1}": {"ansible_host": a} for k, a in enumerate(addresses)}


def run_fleet_role(tmp_path: Path, groups: dict[str, dict[str, dict]], **extra) -> subprocess.CompletedProcess:
    bin_dir = os.environ.get("HSEXTRACT_ANSIBLE_BIN")
    if not bin_dir:
        pytest.skip("$HSEXTRACT_ANSIBLE_BIN is not set (make test sets it)")
    inventory = {"all": {"children": {name: {"hosts": hosts} for name, hosts in groups.items()}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(PLAY)
    env = ansiballz_cache.with_cache(
        {
            **os.environ,
            "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
            "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        }
    )
    return subprocess.run(
        [
            str(Path(bin_dir) / "ansible-playbook"),
            "-i",
            str(tmp_path / "inventory.yml"),
            str(tmp_path / "play.yml"),
            "-e",
            json.dumps(extra),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def shards(out: str) -> dict[str, str]:
    """host -> the shard the play printed for it."""
    found = {}
    lines = out.splitlines()
    for k, line in enumerate(lines):
        if line.startswith("ok: [") and "=> {" in line:
            host = line[5 : line.index("]")]
            msg = next(x for x in lines[k + 1 :] if '"msg"' in x)
            found[host] = json.loads("{" + msg.strip().rstrip(",") + "}")["msg"]
    return found


def test_each_host_takes_the_shard_of_its_place_in_the_group_unless_its_shard_is_set(tmp_path):
    r = run_fleet_role(tmp_path, {"hsextract": at("198.18.9.1", "198.18.9.2", "198.18.9.3")})
    assert r.returncode == 0, r.stdout[-3000:]
    assert shards(r.stdout) == {"h1": "0/3", "h2": "1/3", "h3": "2/3"}


def test_one_host_takes_the_whole_dataset(tmp_path):
    r = run_fleet_role(tmp_path, {"hsextract": at("198.18.9.1")})
    assert r.returncode == 0 and shards(r.stdout) == {"h1": "0/1"}, r.stdout[-3000:]


def test_a_limit_does_not_change_a_hosts_shard(tmp_path):
    run_fleet_role(tmp_path, {"hsextract": at("198.18.9.1", "198.18.9.2")})
    bin_dir = Path(os.environ["HSEXTRACT_ANSIBLE_BIN"])
    env = ansiballz_cache.with_cache({**os.environ, "ANSIBLE_ROLES_PATH": str(REPO / "roles"), "ANSIBLE_NOCOLOR": "1"})
    r = subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", "inventory.yml", "play.yml", "--limit", "h2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and '"msg": "1/2"' in r.stdout, r.stdout[-3000:]


def test_one_machine_under_two_names_is_refused_naming_both(tmp_path):
    alias = {"h1b": {"ansible_host": "198.18.9.1"}}
    r = run_fleet_role(tmp_path, {"hsextract": {**at("198.18.9.1", "198.18.9.2"), **alias}})
    assert r.returncode != 0
    assert "lists one machine under several names: h1 and h1b are one machine (198.18.9.1:22)." in r.stdout
    assert "Show the shard." not in r.stdout, "no host went on"


def test_the_same_address_on_other_ports_is_two_machines(tmp_path):
    r = run_fleet_role(
        tmp_path,
        {
            "hsextract": {
                "h1": {"ansible_host": "198.18.9.1", "ansible_port": 2201},
                "h2": {"ansible_host": "198.18.9.1", "ansible_port": 2202},
            }
        },
    )
    assert r.returncode == 0, r.stdout[-3000:]


def test_hosts_of_two_fleets_in_one_play_are_refused(tmp_path):
    r = run_fleet_role(
        tmp_path,
        {
            "hsextract": {
                "h1": {"ansible_host": "198.18.9.1", "hsextract_fleet": "one"},
                "h2": {"ansible_host": "198.18.9.2", "hsextract_fleet": "two"},
            },
            "one": {"h1": {}},
            "two": {"h2": {}},
        },
    )
    assert r.returncode != 0
    assert "this play runs the hosts of 2 fleets (hsextract_fleet: one, two)" in r.stdout, r.stdout[-3000:]


def test_a_regeneration_per_host_is_refused_in_a_fleet(tmp_path):
    r = run_fleet_role(tmp_path, {"hsextract": at("198.18.9.1", "198.18.9.2")}, hsextract_regenerate=True)
    assert r.returncode != 0
    assert "hsextract_regenerate=true with a fleet of 2 hosts (hsextract_fleet=hsextract)" in r.stdout


def test_a_host_outside_its_fleets_group_is_refused(tmp_path):
    r = run_fleet_role(tmp_path, {"hsextract": at("198.18.9.1")}, hsextract_fleet="gpus")
    assert r.returncode != 0
    assert "h1 is not in hsextract_fleet=gpus (no such group)" in r.stdout, r.stdout[-3000:]
