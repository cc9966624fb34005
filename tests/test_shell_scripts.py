"""The shell scripts pass shellcheck, and `make lint` runs every linter the suite runs, once."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.lint
def test_shell_scripts_pass_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (.ci/run installs it: apt-get install shellcheck)")
    scripts = [*sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scripts").glob("*.sh")), ".ci/run"]
    assert len(scripts) >= 3, scripts
    r = subprocess.run(["shellcheck", *scripts], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


LINTERS = ("ruff", "mypy", "yamllint", "--syntax-check", "ansible-lint", "shellcheck")


def test_make_lint_runs_every_linter_the_suite_runs():
    """`make lint` is the suite's lint tests (marker `lint`), so a linter runs once per `make test`
    and `make lint` can never check less than the suite: every test that calls a linter carries
    the marker."""
    r = subprocess.run(["make", "-n", "lint"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "-m lint" in r.stdout and "pytest" in r.stdout, f"`make lint` does not run the lint tests:\n{r.stdout}"
    unmarked = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        source = path.read_text()
        for match in re.finditer(r"(?:@pytest\.mark\.\w+[^\n]*\n)*def (test_\w+)\(", source):
            body = source[match.end() : source.find("\ndef ", match.end())]
            calls_linter = any(f'"{linter}"' in body or f'tool("{linter}")' in body for linter in LINTERS)
            if calls_linter and "@pytest.mark.lint" not in match.group(0):
                unmarked.append(f"{path.relative_to(ROOT)}::{match.group(1)}")
    assert not unmarked, f"tests that run a linter without the lint marker: {unmarked}"
