"""The Ansible code passes yamllint, ansible-playbook --syntax-check and ansible-lint's production profile."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = ["extract.yml", *sorted(str(p.relative_to(REPO)) for p in (REPO / "playbooks").glob("*.yml"))]


def tool(name: str) -> str:
    bin_dir = os.environ.get("HSEXTRACT_ANSIBLE_BIN")
    if not bin_dir:
        pytest.skip("$HSEXTRACT_ANSIBLE_BIN is not set (make test sets it to the controller venv's bin dir)")
    return str(Path(bin_dir) / name)


def run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "NO_COLOR": "1", "PY_COLORS": "0"}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.lint
def test_yaml_files_pass_yamllint():
    r = run(tool("yamllint"), "--strict", ".")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.lint
@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_passes_syntax_check(playbook):
    r = run(tool("ansible-playbook"), "--syntax-check", playbook)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.lint
def test_ansible_code_passes_ansible_lint_production_profile():
    r = run(tool("ansible-lint"), "--offline", "--profile", "production", "--nocolor", timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]


def test_every_role_documents_its_interface_and_validates_it():
    for role in sorted(p for p in (REPO / "roles").iterdir() if p.is_dir()):
        assert (role / "defaults" / "main.yml").is_file(), f"{role.name}: no defaults/main.yml"
        assert (role / "meta" / "argument_specs.yml").is_file(), f"{role.name}: no meta/argument_specs.yml"


def test_every_template_starts_with_the_ansible_managed_header():
    templates = sorted((REPO / "roles").glob("*/templates/**/*.j2"))
    assert len(templates) >= 6, templates  # three units, run.json, the capture package's two modules
    for template in templates:
        if template.name.endswith(".json.j2"):  # JSON has no comments: the header is a key
            assert '"_comment": ansible_managed' in template.read_text(), template
        else:
            assert template.read_text().startswith("{{ ansible_managed | comment }}"), template
