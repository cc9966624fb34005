"""The names of a run's files have one owner, hsextract.layout, and the roles' copies equal it.

Ansible reads some of the files the client and the drain write (whether a run has finished is
the client's summary file); a role cannot import Python, so it spells the path, and these tests
fail the moment the two spellings differ.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from hsextract import layout

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_FILES = sorted([*(REPO / "roles").rglob("*.yml"), *(REPO / "roles").rglob("*.j2"),
                        *(REPO / "playbooks").glob("*.yml"), REPO / "extract.yml"])
# The file name ends in a letter, digit, _ or -: a sentence's full stop after it is not part of it.
STATE_FILE_RE = re.compile(r"\}\}/(\.[A-Za-z0-9_-]+)/([A-Za-z0-9_.-]*[A-Za-z0-9_-])")


def test_the_extraction_role_looks_for_the_summary_the_client_writes_of_any_shard():
    tasks = (REPO / "roles" / "extraction" / "tasks" / "main.yml").read_text()
    where = f"paths: \"{{{{ hsextract_output_dir }}}}/{layout.STATE_DIR}\""
    stem, _, ext = layout.CLIENT_SUMMARY.partition(".")
    pattern = f"patterns: \"{stem}*.{ext}\""
    assert where in tasks and pattern in tasks, f"roles/extraction/tasks/main.yml must look for {pattern} in {where}"
    names = [layout.client_summary_path("o").name, layout.client_summary_path("o", (1, 4)).name]
    assert all(fnmatch.fnmatch(name, f"{stem}*.{ext}") for name in names), names


def test_every_state_file_a_role_names_is_one_the_layout_defines():
    known = {v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str)}
    named = []
    for path in ANSIBLE_FILES:
        for m in STATE_FILE_RE.finditer(path.read_text()):
            named.append((path.relative_to(REPO), m[1], m[2]))
    assert named, "the roles name no file of an output directory's bookkeeping: is the pattern stale?"
    wrong = [f"{p}: {d}/{f}" for p, d, f in named if d != layout.STATE_DIR or f not in known]
    assert not wrong, f"files named by the roles that hsextract.layout does not define: {wrong}"


def test_the_paths_are_under_the_output_and_staging_directories(tmp_path):
    out, dump = tmp_path / "out", tmp_path / "dump"
    assert layout.client_summary_path(out) == out / ".hsextract" / "client-summary.json"
    assert layout.client_status_path(out) == out / ".hsextract" / "client-status.json"
    assert layout.drain_status_path(out) == out / ".hsextract" / "drain-status.json"
    assert layout.failures_path(out) == out / ".hsextract" / "failures.jsonl"
    assert layout.rejects_path(out) == out / ".hsextract" / "rejects.jsonl"
    assert layout.default_quarantine_dir(out) == out / "quarantine"
    assert layout.record_path(dump, "hsx-0123abcd-7") == dump / "_records" / "hsx-0123abcd-7.json"


def test_a_writers_temporary_file_among_the_records_is_no_record(tmp_path):
    path = layout.record_path(tmp_path, "hsx-0123abcd-7")
    assert layout.record_rid(path.name) == "hsx-0123abcd-7"
    assert layout.record_rid(f".{path.name}.123.456.0.tmp") is None
    assert layout.record_rid("notes.txt") is None
