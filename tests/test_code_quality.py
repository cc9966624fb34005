"""The Python code base is ruff formatted, ruff and mypy clean, within its size bounds and free of
machine-specific paths."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "files" / "python" / "hsextract"

# A module, a class or a function past its bound has more than one job: split it along its seams.
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 60


@pytest.mark.lint
def test_python_sources_pass_ruff():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "files/python", "tests", "bench", "roles"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"ruff found problems:\n{result.stdout}{result.stderr}"


@pytest.mark.lint
def test_python_sources_are_formatted_as_ruff_formats_them():
    # One layout for every file, so a diff shows what changed and never how someone wraps lines.
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "files/python", "tests", "bench", "roles"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"ruff format would change these files (run `ruff format`):\n{result.stdout}{result.stderr}"
    )


def _oversized(path: Path) -> dict[str, int]:
    """Each part of one module past its bound, with its lines (a definition's: its first line to its last)."""
    text = path.read_text()
    name = str(path.relative_to(PACKAGE))
    found = {name: len(text.splitlines())} if len(text.splitlines()) > MAX_MODULE_LINES else {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            kind, bound = (
                ("class", MAX_CLASS_LINES) if isinstance(node, ast.ClassDef) else ("function", MAX_FUNCTION_LINES)
            )
            if lines > bound:
                found[f"{name}: {kind} {node.name}"] = lines
    return found


@pytest.mark.lint
def test_no_module_class_or_function_of_the_package_outgrows_its_bound():
    oversized: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        oversized |= _oversized(path)
    assert not oversized, (
        f"past the bounds (module {MAX_MODULE_LINES}, class {MAX_CLASS_LINES}, function {MAX_FUNCTION_LINES} "
        f"lines): split along its seams: {oversized}"
    )


@pytest.mark.lint
def test_the_package_passes_mypy():
    # mypy is a controller tool (requirements/controller.txt); it checks against this env's packages
    bin_dir = os.environ.get("HSEXTRACT_ANSIBLE_BIN")
    if not bin_dir:
        pytest.skip("$HSEXTRACT_ANSIBLE_BIN is not set (make test sets it to the controller venv's bin dir)")
    # Its cache beside the environment it checks against: most of a cold run is reading torch's and
    # transformers' annotations, which change only with that environment (measured in
    # docs/testing.md); mypy rechecks whatever changed since, by each file's hash.
    cache = Path(sys.prefix).parent / "mypy-cache" / Path(sys.prefix).name
    result = subprocess.run(
        [
            str(Path(bin_dir) / "python"),
            "-m",
            "mypy",
            "--python-executable",
            sys.executable,
            "--cache-dir",
            str(cache),
            "hsextract",
        ],
        cwd=ROOT / "files" / "python",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"mypy found problems:\n{result.stdout}{result.stderr}"


def test_committed_files_name_no_path_of_a_developer_machine():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in tracked:
        path = ROOT / name
        if not path.is_file() or path.suffix in {".safetensors", ".bin", ".png"} or path == Path(__file__).resolve():
            continue
        text = path.read_text(errors="replace")
        for needle in ("/work/main", "/work/shared", "hsextract/boot"):
            if needle in text:
                offenders.append(f"{name}: {needle}")
    assert not offenders, "machine-specific paths committed:\n" + "\n".join(offenders)
