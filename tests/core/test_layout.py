"""The names of a run's files have one owner, hsextract.output.layout, and the roles take theirs from it.

Ansible reads some of the files the client and the drain write (whether a run has finished is
the client's summary file). The roles never spell such a path: roles/hsextract/vars/main.yml
derives each one from the output directory with the hsextract_layout_path filter, which asks this
module (tests/ansible/test_settings_filters.py), and every task uses those variables.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import yaml
from hsextract.output import layout
from hsextract.shard import Shard
from hsextract.staging import names

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_FILES = sorted(
    [
        *(REPO / "roles").rglob("*.yml"),
        *(REPO / "roles").rglob("*.j2"),
        *(REPO / "playbooks").glob("*.yml"),
        REPO / "extract.yml",
    ]
)
DERIVED = re.compile(r"^\{\{ (hsextract_\w+_(?:dir|local)) \| hsextract_layout_path\('(\w+)'\) \}\}$")


def test_no_role_or_playbook_spells_a_path_inside_the_output_bookkeeping():
    spelled = [str(p.relative_to(REPO)) for p in ANSIBLE_FILES if f"/{layout.STATE_DIR}/" in p.read_text()]
    assert not spelled, f"paths under {layout.STATE_DIR}/ written out (use roles/hsextract/vars/main.yml): {spelled}"


def test_the_roles_derive_each_file_they_read_from_the_layout():
    derived = yaml.safe_load((REPO / "roles" / "hsextract" / "vars" / "main.yml").read_text())
    names = {}
    for variable, value in derived.items():
        m = DERIVED.match(value)
        assert m, f"{variable}: {value!r} is not derived with hsextract_layout_path"
        assert callable(getattr(layout, f"{m[2]}_path", None)), (
            f"{variable}: hsextract.output.layout has no {m[2]}_path"
        )
        names[variable] = m[2]
    assert names == {
        "hsextract_dataset_record_file": "dataset_record",
        "hsextract_client_summary_file": "client_summary",
        "hsextract_regen_summary_file": "regen_summary",
    }


def test_the_extraction_role_looks_for_the_summary_the_client_writes_of_any_shard():
    tasks = yaml.safe_load((REPO / "roles" / "extraction" / "tasks" / "main.yml").read_text())
    lookup = next(t for t in tasks if t["name"] == "Look for the summary of a finished run.")["ansible.builtin.find"]
    assert lookup["paths"] == "{{ hsextract_client_summary_file | dirname }}"
    assert lookup["patterns"] == "{{ (hsextract_client_summary_file | basename | splitext)[0] }}*.json"
    stem = layout.client_summary_path("o").name.rsplit(".", 1)[0]
    names = [layout.client_summary_path("o").name, layout.client_summary_path("o", Shard(1, 4)).name]
    assert all(fnmatch.fnmatch(name, f"{stem}*.json") for name in names), names


def test_the_paths_are_under_the_output_and_staging_directories(tmp_path):
    out, dump = tmp_path / "out", tmp_path / "dump"
    assert layout.client_summary_path(out) == out / ".hsextract" / "client-summary.json"
    assert layout.client_status_path(out) == out / ".hsextract" / "client-status.json"
    assert layout.drain_status_path(out) == out / ".hsextract" / "drain-status.json"
    assert layout.failures_path(out) == out / ".hsextract" / "failures.jsonl"
    assert layout.rejects_path(out) == out / ".hsextract" / "rejects.jsonl"
    assert layout.default_quarantine_dir(out) == out / "quarantine"
    assert names.record_path(dump, "hsx-0123abcd-7") == dump / "_records" / "hsx-0123abcd-7.json"


def test_a_writers_temporary_file_among_the_records_is_no_record(tmp_path):
    path = names.record_path(tmp_path, "hsx-0123abcd-7")
    assert names.record_rid(path.name) == "hsx-0123abcd-7"
    assert names.record_rid(f".{path.name}.123.456.0.tmp") is None
    assert names.record_rid("notes.txt") is None
