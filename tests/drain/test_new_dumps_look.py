"""An idle drain writes a dump staged while it waits at once, not at its next full scan.

Nothing wakes the drain when the capture stages a dump. On the H200, an idle drain that looked
again only after its half-second poll let a client sending ~400 small samples/s stage ~200 in the
meantime and stop at its --max-staged; the drain then emptied staging in a fraction of the wait."""

from __future__ import annotations

import threading
import time

import pytest
from hsextract.drain import scan as scan_mod
from hsextract.drain.core import DrainConfig, Drainer
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from support.staged_dumps import stage_sample

pytestmark = pytest.mark.timeout(120)

FULL_SCAN_S = 30.0


def test_a_dump_staged_while_the_drain_waits_is_written_long_before_its_next_full_scan(tmp_path, monkeypatch):
    dump, out = tmp_path / "dump", tmp_path / "out"
    dump.mkdir()
    run = load_or_create_run_id(out)
    scanned = threading.Event()
    real = scan_mod.Scanner.scan_and_submit

    def scan_and_tell(self, pool):
        submitted = real(self, pool)
        scanned.set()
        return submitted

    monkeypatch.setattr(scan_mod.Scanner, "scan_and_submit", scan_and_tell)
    cfg = DrainConfig(
        dump_dir=dump,
        output=out,
        format="speculators",
        workers=1,
        worker_mode="threads",
        count_vocab=False,
        finalize_idle_s=3600,
        poll_interval_s=FULL_SCAN_S,
    )
    drainer = Drainer(cfg)
    thread = threading.Thread(target=drainer.run)
    thread.start()
    try:
        assert scanned.wait(60), "the drain never scanned staging"
        staged_at = time.monotonic()  # after the first full scan: the next is FULL_SCAN_S away
        stage_sample(dump, run, 0)
        while not list(iter_entries(out)):
            waited = time.monotonic() - staged_at
            assert waited < FULL_SCAN_S / 3, f"the staged sample was not written in {waited:.1f} s"
            assert thread.is_alive(), "the drain stopped"
            time.sleep(0.01)
    finally:
        drainer.stop_event.set()
        thread.join(60)
    assert [e.dataset_index for e in iter_entries(out)] == [0]
