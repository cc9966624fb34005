"""``collect --into DIR`` writes only into a new or empty directory or into a set collect made, and
changes nothing there when it admits no host.

A collect overwrites a directory's ``README.md`` and ``state.json`` and removes sample files past
its manifest's end; given a directory of something else by mistake (a project, another training
set), it must refuse it before it writes anything, naming the directory and what it found."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hsextract.output.manifest import iter_entries

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` (directories as None), with its bytes: what a refusal must leave as it was."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirs, names in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for n in names:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, root)] = Path(p).read_bytes()
    return out


def _project(into: Path, fleet) -> str:
    into.mkdir()
    (into / "README.md").write_text("# my project\n")
    (into / "state.json").write_text('{"mine": 1}\n')
    return "README.md, state.json"


def _samples(into: Path, fleet) -> str:
    (into / "hidden_states").mkdir(parents=True)
    for i in range(4):
        (into / "hidden_states" / f"hs_{i}.safetensors").write_text(f"precious {i}\n")
    return "hidden_states/"


def _drain_output(into: Path, fleet) -> str:
    import shutil

    shutil.copytree(fleet.hosts["a"], into)
    return "manifest.json"


@pytest.mark.parametrize("fill", [_project, _samples, _drain_output], ids=["project", "samples", "drain-output"])
def test_a_non_empty_directory_that_holds_no_collected_set_is_refused_and_left_as_it_was(
    fill, fleets, collect, tmp_path
):
    fleet, into = fleets("speculators"), tmp_path / "into"
    found = fill(into, fleet)
    before = _tree(into)
    code, err = collect("--into", str(into), *fleet.args())
    assert code == 2, err
    assert f"--into {into} is not empty and holds no collected set" in err
    assert found in err
    assert _tree(into) == before


def test_a_collect_that_admits_no_host_changes_nothing_in_the_set(fleets, collect, tmp_path):
    fleet, into = fleets("speculators"), tmp_path / "collected"
    code, err = collect("--into", str(into), "--final", *fleet.args())
    assert code == 0, err
    before = _tree(into)
    other = fleets("speculators").copy(tmp_path / "other-run")
    for host in other.hosts.values():
        header = json.loads((host / "manifest.json").read_text())
        (host / "manifest.json").write_text(json.dumps({**header, "run_id": "0badc0de"}))
    code, err = collect("--into", str(into), *other.args("a", "b"), f"c={tmp_path / 'no-such-host'}")
    assert code == 3
    assert "run identity is '0badc0de', expected 'c011ec70' (as the collected set has it)" in err
    assert "no host output was admitted: nothing in the collected set was changed" in err
    assert {k: v for k, v in _tree(into).items() if not k.endswith(".lock")} == {
        k: v for k, v in before.items() if not k.endswith(".lock")
    }


def test_a_new_directory_a_collect_admitting_no_host_left_is_taken_by_the_next(fleets, collect, tmp_path):
    fleet, into = fleets("speculators"), tmp_path / "collected"
    code, err = collect("--into", str(into), f"a={tmp_path / 'no-such-host'}")
    assert code == 3, err
    code, err = collect("--into", str(into), *fleet.args())
    assert code == 0, err
    assert sorted(e.dataset_index for e in iter_entries(into)) == sorted(fleet.samples)
