"""The drain holds one target, where the set lives (hsextract.output.target), and never asks which
kind it is: a target of a kind the drain has never heard of is driven through the seam alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hsextract.drain import core
from hsextract.drain.core import DrainConfig, Drainer
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from hsextract.output.target import DirectoryTarget
from support.drain_proc import finish_client
from support.staged_dumps import stage_sample

pytestmark = pytest.mark.slow


class ShelfTarget(DirectoryTarget):
    """A third kind of home: the directory's commit, with its own publish and status."""

    where = "the shelf"

    def __init__(self) -> None:
        self.published: list[list[str]] = []

    def publish_dataset_files(self, work: Path) -> None:
        self.published.append(sorted(p.name for p in work.iterdir() if p.is_file()))

    def status(self) -> dict[str, Any]:
        return {"shelf": "B3", "published": len(self.published)}


def test_a_target_of_another_kind_gets_the_samples_the_dataset_files_and_the_status(tmp_path, monkeypatch):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    for i in range(3):
        stage_sample(dump, run, i)
    finish_client(out, 3)
    shelf = ShelfTarget()
    monkeypatch.setattr(core, "open_target", lambda cfg, fmt, stop: shelf)
    cfg = DrainConfig(dump_dir=dump, output=out, format="speculators", workers=1, exit_when_done=True)
    assert Drainer(cfg).run() == 0
    assert sorted(e.dataset_index for e in iter_entries(out)) == [0, 1, 2]
    assert shelf.published and "state.json" in shelf.published[-1]
    status = json.loads((out / ".hsextract" / "drain-status.json").read_text())
    assert status["objectstore"] == {"shelf": "B3", "published": len(shelf.published)}
