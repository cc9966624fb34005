"""With a backlog staged, the drain's main thread does not list the staging directory for every sample.

A scan woken by a worker that freed a slot first takes the dumps the last full scan found ready;
listing a directory of thousands of dumps after every sample was the main thread's largest cost
(py-spy of `bench/drain_small_samples.py`). What it takes is triaged again, so a dump written or
removed since the full scan is not sent to a worker a second time."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from hsextract.drain import scan as scan_mod
from hsextract.drain.core import DrainConfig, Drainer
from hsextract.output.layout import client_summary_path
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from support.staged_dumps import stage_sample

pytestmark = pytest.mark.timeout(300)

SAMPLES = 60


def _drain(dump, out, **overrides) -> Drainer:
    # One worker: a queue of two slots, so the scan is woken about twice per sample.
    cfg = DrainConfig(
        dump_dir=dump,
        output=out,
        format="speculators",
        exit_when_done=True,
        workers=1,
        worker_mode="threads",
        count_vocab=False,
        finalize_idle_s=3600,
        **overrides,
    )
    return Drainer(cfg)


def _backlog(tmp_path, n: int = SAMPLES):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    staged = [stage_sample(dump, run, i) for i in range(n)]
    client_summary_path(out).parent.mkdir(parents=True, exist_ok=True)
    client_summary_path(out).write_text(json.dumps({"dataset_lines": n, "shard": [0, 1]}))
    return dump, out, staged


def test_a_backlog_is_drained_whole_with_a_listing_per_full_scan_not_per_sample(tmp_path, monkeypatch):
    dump, out, _ = _backlog(tmp_path)
    listings = 0
    real = scan_mod.iter_dump_names

    def counted(path):
        nonlocal listings
        listings += 1
        return real(path)

    monkeypatch.setattr(scan_mod, "iter_dump_names", counted)
    # Full scans at most every 30 s, and no look for new dumps between them (a look every 50 ms is
    # bounded by time, not by samples): every other scan is woken by a freed slot or a written sample.
    assert _drain(dump, out, poll_interval_s=30.0, new_dumps_look_s=30.0).run() == 0
    assert sorted(e.dataset_index for e in iter_entries(out)) == list(range(SAMPLES))
    # A listing per sample was 106; what is left is the tail of the backlog, where each wake with a free
    # slot and nothing ready lists staging (15 to 19 on a 2-core machine, more under load).
    assert listings <= SAMPLES // 2, f"{listings} listings of staging for {SAMPLES} samples"


def test_a_ready_dump_removed_after_the_full_scan_is_not_sent_to_a_worker(tmp_path, monkeypatch, caplog):
    dump, out, _ = _backlog(tmp_path, 6)
    removed: list[int] = []
    real_take = scan_mod.Scanner._take_ready

    def take_after_removing(self, scan, pool):
        waiting = [rid for rid in self._ready if rid not in self._inflight]
        if not removed and waiting:
            shutil.rmtree(dump / waiting[-1])  # as a person cleaning staging by hand would
            removed.append(int(waiting[-1].rsplit("-", 1)[1]))
        return real_take(self, scan, pool)

    monkeypatch.setattr(scan_mod.Scanner, "_take_ready", take_after_removing)
    with caplog.at_level(logging.ERROR, logger="hsextract.drain"):
        _drain(dump, out, poll_interval_s=30.0).run()  # its run check misses the removed sample
    assert removed, "no early scan found a ready dump to take"
    assert sorted(e.dataset_index for e in iter_entries(out)) == sorted(set(range(6)) - set(removed))
    assert "drain worker failed" not in caplog.text and "quarantined" not in caplog.text
