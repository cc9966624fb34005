"""The shell scripts pass shellcheck, and `make lint` runs every linter the suite runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_shell_scripts_pass_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (.ci/run installs it: apt-get install shellcheck)")
    scripts = [*sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scripts").glob("*.sh")), ".ci/run"]
    assert len(scripts) >= 3, scripts
    r = subprocess.run(["shellcheck", *scripts], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_make_lint_runs_every_linter_the_suite_runs():
    r = subprocess.run(["make", "-n", "lint"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for command in ("ruff check files/python tests bench", "yamllint --strict .", "ansible-playbook --syntax-check",
                    "ansible-lint --offline --profile production", "shellcheck scripts/*.sh .ci/run"):
        assert command in r.stdout, f"`make lint` does not run {command!r}:\n{r.stdout}"
    for playbook in ("extract.yml", "playbooks/smoke.yml", "playbooks/status.yml", "playbooks/teardown.yml"):
        assert playbook in r.stdout, playbook
