"""The hsextract wheel carries what its commands need outside the repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_the_installed_package_finds_the_capture_patch_templates_without_the_repository(tmp_path):
    # Built from a copy, as the ml_env role does on a host (links followed), leaving the tree clean.
    src = tmp_path / "src"
    shutil.copytree(REPO / "files" / "python", src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "wheel"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    site = tmp_path / "site"
    with zipfile.ZipFile(next((tmp_path / "wheel").glob("hsextract-*.whl"))) as whl:
        whl.extractall(site)
    found = subprocess.run(
        [sys.executable, "-c", "from hsextract.capture.patch import template_dir; print(template_dir())"],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.returncode == 0, found.stderr[-3000:]
    shipped = Path(found.stdout.strip())
    assert shipped.is_relative_to(site), f"templates found at {shipped}, not in the installed package"
    for name in ("__init__.py.j2", "model.py.j2"):
        assert (shipped / name).read_bytes() == (REPO / "roles" / "capture_patch" / "templates" / name).read_bytes()
