"""The Python code base is ruff clean and free of machine-specific paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_python_sources_pass_ruff():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "files/python", "tests", "bench"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, f"ruff found problems:\n{result.stdout}{result.stderr}"


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
