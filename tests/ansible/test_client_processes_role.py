"""Several client processes per host, as the roles render them: the unit, the units' names, and
the summaries the extraction role reads to tell a process's finished sub-shard.

``hsextract_client_processes`` (roles/hsextract): "auto" is the server's data parallelism
(``sglang_server_dp``) when above 1, else 1. One process keeps the unit exactly as before
(hsextract-extract.service, no ``--process``); P > 1 installs the template unit
hsextract-extract@.service whose instance j runs ``--process j/P``. Rendered by Ansible from the
roles' own defaults and template, on this host, into a temporary directory.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from support.role_play import playbook

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"
UNIT_TEMPLATE = ROLES / "extraction" / "templates" / "hsextract-extract.service.j2"
DEFAULTS = ("hsextract", "sglang_server", "extraction", "service_handlers", "regeneration")
CASES = {
    "one": {},
    "dp8": {"sglang_server_dp": 8},
    "two_of_shard": {"sglang_server_dp": 8, "hsextract_client_processes": 2, "hsextract_shard": "1/2"},
    "two_regenerated": {"hsextract_client_processes": 2, "hsextract_shard": "1/2", "hsextract_regenerate": True},
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    """cases/<case>/unit.service and facts.json, one inventory host per case."""
    tmp = tmp_path_factory.mktemp("client-processes")
    out = str(tmp / "cases" / "{{ inventory_hostname }}")
    (tmp / "base.yml").write_text(
        yaml.safe_dump(
            {
                "hsextract_on_cpu": True,
                "hsextract_model_path": "/srv/model",
                "hsextract_dataset": "/srv/data/train.jsonl",
                "hsextract_output_dir": "/srv/out",
                "hsextract_format": "speculators",
            }
        )
    )
    for case, overrides in CASES.items():
        (tmp / f"override-{case}.yml").write_text(yaml.safe_dump(overrides or {"hsextract_client_processes": "auto"}))
    play = [
        {
            "name": "Render the client's unit and its names for every case.",
            "hosts": "all",
            "gather_facts": False,
            "vars_files": [*(str(ROLES / r / "defaults" / "main.yml") for r in DEFAULTS), str(tmp / "base.yml")],
            "tasks": [
                {
                    "name": "Load the case's overrides.",
                    "ansible.builtin.include_vars": str(tmp / "override-{{ inventory_hostname }}.yml"),
                },
                {
                    "name": "Create the case's directory.",
                    "ansible.builtin.file": {"path": out, "state": "directory", "mode": "0755"},
                },
                {
                    "name": "Render the client's unit.",
                    "ansible.builtin.template": {
                        "src": str(UNIT_TEMPLATE),
                        "dest": f"{out}/unit.service",
                        "mode": "0644",
                    },
                },
                {
                    "name": "Record the names the roles derive.",
                    "ansible.builtin.copy": {
                        "dest": f"{out}/facts.json",
                        "mode": "0644",
                        "content": (
                            "{{ {'processes': extraction_processes | int, 'units': extraction_units,"
                            " 'installed_as': extraction_unit if extraction_processes | int == 1"
                            " else extraction_template_unit,"
                            " 'handler_unit': service_handlers_client_unit,"
                            " 'regeneration_stops': regeneration_client_units,"
                            " 'summaries': hsextract_client_shard | hsextract_process_shards(extraction_processes)"
                            " | map('hsextract_summary_path', hsextract_output_dir) | list} | to_json }}"
                        ),
                    },
                },
            ],
        }
    ]
    r = playbook(
        tmp,
        play,
        {case: {} for case in CASES},
        env={"ANSIBLE_FILTER_PLUGINS": str(ROLES / "hsextract" / "filter_plugins")},
    )
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
    return tmp / "cases"


def _facts(rendered: Path, case: str) -> dict:
    return json.loads((rendered / case / "facts.json").read_text())


def _unit(rendered: Path, case: str) -> dict[str, str]:
    return dict(
        line.split("=", 1)
        for line in (rendered / case / "unit.service").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )


def test_one_process_keeps_the_plain_unit_and_its_command_line(rendered):
    facts = _facts(rendered, "one")
    assert facts["processes"] == 1 and facts["units"] == ["hsextract-extract.service"]
    assert facts["installed_as"] == facts["handler_unit"] == "hsextract-extract.service"
    assert facts["regeneration_stops"] == ["hsextract-extract.service"]
    unit = _unit(rendered, "one")
    assert shlex.split(unit["ExecStart"])[-3:] == ["extract", "--config", "/etc/hsextract/run.json"]
    assert unit["Description"] == "hsextract: extraction client for /srv/out"


def test_auto_runs_a_process_per_data_parallel_rank_as_instances_of_a_template_unit(rendered):
    facts = _facts(rendered, "dp8")
    assert facts["processes"] == 8 and facts["installed_as"] == "hsextract-extract@.service"
    assert facts["units"] == [f"hsextract-extract@{j}.service" for j in range(8)]
    assert facts["handler_unit"] == "hsextract-extract@*.service", "the handlers restart every instance"
    assert facts["regeneration_stops"] == facts["units"]


def test_each_instance_runs_its_process_of_the_host_shard(rendered):
    unit = _unit(rendered, "dp8")
    assert shlex.split(unit["ExecStart"])[-2:] == ["--process", "%i/8"]
    assert unit["Description"] == "hsextract: extraction client %i of 8 for /srv/out"


def test_an_explicit_number_wins_over_the_servers_data_parallelism(rendered):
    facts = _facts(rendered, "two_of_shard")
    assert facts["processes"] == 2 and shlex.split(_unit(rendered, "two_of_shard")["ExecStart"])[-1] == "%i/2"


def test_each_process_is_told_finished_by_the_summary_of_its_sub_shard(rendered):
    # host shard 1/2, two processes: 1/4 and 3/4
    assert _facts(rendered, "two_of_shard")["summaries"] == [
        "/srv/out/.hsextract/client-summary.shard-1-of-4.json",
        "/srv/out/.hsextract/client-summary.shard-3-of-4.json",
    ]


def test_with_a_regeneration_the_processes_split_the_regenerated_dataset_whole(rendered):
    # the regenerated dataset is this host's shard already: the run config has no shard
    assert _facts(rendered, "two_regenerated")["summaries"] == [
        "/srv/out/.hsextract/client-summary.shard-0-of-2.json",
        "/srv/out/.hsextract/client-summary.shard-1-of-2.json",
    ]
