"""The suite's AnsiballZ code cache (support.ansiballz_cache) keeps what Python compiles from a
module's zip, and a module run from it does what it does without it.

The sandbox and fleet plays run a few thousand module tasks; each compiled ansible.module_utils
from source (a `stat` loop item's module process: 0.33 CPU-s, 0.18 from the cache). A cache that
returned other code, or that a damaged entry broke, would change what the suite tests."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support import ansiballz_cache
from support.ansible_env import ansible_bin

pytestmark = pytest.mark.timeout(300)


def stat_play(tmp_path: Path, env: dict[str, str]) -> dict:
    """One `stat` task on localhost under the controller's Ansible; its registered result."""
    out = tmp_path / "stat.json"
    out.unlink(missing_ok=True)  # so that every play runs the same modules (copy skips an unchanged file)
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Read the file.",
                    "ansible.builtin.stat": {"path": str(tmp_path / "probe.txt")},
                    "register": "st",
                },
                {
                    "name": "Keep what it read.",
                    "ansible.builtin.copy": {
                        "dest": str(out),
                        "mode": "0644",
                        "content": "{{ {'exists': st.stat.exists, 'size': st.stat.size} | to_json }}",
                    },
                },
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
        timeout=240,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **env},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text())


def test_a_module_run_from_the_cache_reads_what_it_reads_without_it(tmp_path):
    (tmp_path / "probe.txt").write_text("twelve bytes")
    env = ansiballz_cache.environment(tmp_path / "cache")
    code = Path(env["HSX_ANSIBALLZ_CACHE"])
    assert stat_play(tmp_path, {}) == {"exists": True, "size": 12}
    assert not any(code.iterdir()), "a play without the cache's environment wrote to it"
    assert stat_play(tmp_path, env) == {"exists": True, "size": 12}
    kept = sorted(p.name for p in code.iterdir())
    assert len(kept) >= 10, f"module_utils were not kept: {kept}"
    assert stat_play(tmp_path, env) == {"exists": True, "size": 12}
    assert sorted(p.name for p in code.iterdir()) == kept, "the second play compiled what the first kept"


def test_a_damaged_entry_is_compiled_again_not_run(tmp_path):
    (tmp_path / "probe.txt").write_text("x")
    env = ansiballz_cache.environment(tmp_path / "cache")
    code = Path(env["HSX_ANSIBALLZ_CACHE"])
    stat_play(tmp_path, env)
    for entry in code.iterdir():
        entry.write_bytes(b"\x00not code")
    assert stat_play(tmp_path, env) == {"exists": True, "size": 1}
    assert all(entry.read_bytes() != b"\x00not code" for entry in code.iterdir()), "a damaged entry was kept"
