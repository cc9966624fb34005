"""The capture_patch role renders its templates with Ansible's own template engine.

The same templates are rendered by `hsextract capture-patch` (plain Jinja2); SGLang imports the
result, so what Ansible writes must be valid Python carrying the configured capture, and the same
bytes the CLI writes. Runs on the host: the role only writes files into a temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ansiballz_cache
from support.ansible_env import ansible_bin

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "hsextract_capture_patch"


def render_with_ansible(tmp_path: Path, model: Path, out: Path, **more: object) -> subprocess.CompletedProcess:
    playbook = tmp_path / "render.yml"
    # The role renders the run's settings (roles/hsextract), as in extract.yml, and notifies the
    # "capture changed" topic, which the sglang_server role listens to there and this play here.
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.import_role: {name: hsextract, tasks_from: settings}\n"
        "    - ansible.builtin.import_role: {name: capture_patch}\n"
        "  handlers:\n"
        "    - {name: Report it., ansible.builtin.debug: {msg: CAPTURE-CHANGED}, listen: capture changed}\n"
    )
    extra = {
        "hsextract_capture_dir": str(out),
        "hsextract_model_path": str(model),
        "hsextract_aux_layer_ids": [1, 3, 4],
        "hsextract_layer_convention": "eagle",
        "hsextract_dump_dir": "/dev/shm/hsextract",
        "hsextract_rid_prefix": "hsx",
        "hsextract_final_hidden": "pre_norm",
        "hsextract_format": "speculators",
        "ansible_python_interpreter": str(ansible_bin() / "python"),
        **more,
    }
    env = ansiballz_cache.with_cache(
        {
            **os.environ,
            "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCALHOST_WARNING": "0",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
        }
    )
    return subprocess.run(
        [
            str(ansible_bin() / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            str(playbook),
            "-e",
            json.dumps(extra),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8, "hidden_size": 64})
    )
    return path


def test_the_rendered_package_is_python_with_the_configured_capture_and_a_rerun_changes_nothing(tmp_path, model):
    out = tmp_path / "patch"
    first = render_with_ansible(tmp_path, model, out)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "CAPTURE-CHANGED" in first.stdout, "a new package must notify 'capture changed'"
    for name in ("__init__.py", "model.py"):
        compiled = subprocess.run(
            [sys.executable, "-m", "py_compile", str(out / PACKAGE / name)], capture_output=True, text=True
        )
        assert compiled.returncode == 0, f"rendered {name} is not valid Python:\n{compiled.stderr}"
    probe = subprocess.run(
        [sys.executable, "-c", f"import json, {PACKAGE}; print(json.dumps({PACKAGE}.CONFIG))"],
        env={**os.environ, "PYTHONPATH": str(out)},
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr
    config = json.loads(probe.stdout)
    assert (
        config["architecture"],
        config["aux_layer_ids"],
        config["final_hidden"],
        config["format"],
        config["dump_dir"],
    ) == ("LlamaForCausalLM", [1, 3, 4], "pre_norm", "speculators", "/dev/shm/hsextract")
    second = render_with_ansible(tmp_path, model, out)
    assert second.returncode == 0 and "changed=0" in second.stdout, second.stdout[-3000:]
    assert "CAPTURE-CHANGED" not in second.stdout, "an unchanged package must not restart the server"


@pytest.mark.parametrize(
    ("writer_process", "precision", "roles"),
    [
        (False, "bf16", {}),
        (True, "bf16", {}),
        (True, "fp8", {"hsextract_precision": "fp8"}),  # the capture stages as the set stores
        (True, "bf16", {"hsextract_precision": "fp8", "hsextract_capture_precision": "bf16"}),  # the drain quantizes
    ],
    ids=["in-process-writer", "writer-process", "fp8-set-fp8-staging", "fp8-set-bf16-staging"],
)
def test_ansible_and_the_cli_render_the_same_bytes(tmp_path, model, writer_process, precision, roles):
    ansible_out, cli_out = tmp_path / "ansible", tmp_path / "cli"
    result = render_with_ansible(tmp_path, model, ansible_out, capture_patch_writer_process=writer_process, **roles)
    assert result.returncode == 0, result.stdout[-3000:]
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "hsextract",
            "capture-patch",
            "--out-dir",
            str(cli_out),
            "--model-path",
            str(model),
            "--aux-layer-ids",
            "1,3,4",
            "--dump-dir",
            "/dev/shm/hsextract",
            "--final-hidden",
            "pre_norm",
            "--format",
            "speculators",
            "--ansible-managed",
            "Ansible managed",
            *([] if writer_process else ["--no-writer-process"]),
            "--precision",
            precision,
        ],
        env={**os.environ, "PYTHONPATH": str(REPO / "files" / "python")},
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0, cli.stderr
    for name in ("__init__.py", "model.py"):
        assert (ansible_out / PACKAGE / name).read_text() == (cli_out / PACKAGE / name).read_text(), name
    # On by default: only the in-process writer is spelled out in the package.
    assert ('"writer_process": false' in (ansible_out / PACKAGE / "__init__.py").read_text().replace('\\"', '"')) == (
        not writer_process
    )
    assert ('"precision": "fp8"' in (ansible_out / PACKAGE / "__init__.py").read_text().replace('\\"', '"')) == (
        precision == "fp8"
    )
