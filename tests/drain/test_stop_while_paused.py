"""A drain asked to stop while it waits for space on a full output volume stops, and loses nothing.

Under systemd a drain that ignores SIGTERM is killed after TimeoutStopSec; it once kept retrying the
sample in hand until the volume had room, whatever the stop.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hsextract.drain.core import DrainConfig, Drainer
from hsextract.output.manifest import completed_indices
from hsextract.output.run_id import load_or_create_run_id
from hsextract.shard import Shard
from hsextract.staging.dumps import staged_indices
from support import volumes
from support.client_run import wait_for
from support.drain_proc import drain_status
from support.fleet import write_client_files
from support.staged_dumps import stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SAMPLES = 12


def _drainer(dump: Path, out: Path) -> Drainer:
    return Drainer(
        DrainConfig(
            dump_dir=dump,
            output=out,
            format="speculators",
            workers=2,
            poll_interval_s=0.05,
            status_interval_s=0.2,
            finalize_idle_s=3600,
            exit_when_done=True,
            enospc_retry_s=5.0,
            selfcheck_share=0.0,
            selfcheck_first=0,
        )
    )


def test_a_drain_stopped_while_paused_on_a_full_volume_stops_and_leaves_its_samples_staged(tmp_path):
    with volumes.small_volume(tmp_path / "vol", "4m") as vol:
        dump, out = tmp_path / "dump", vol / "out"
        run = load_or_create_run_id(out)
        for i in range(SAMPLES):
            stage_sample(dump, run, i, tokens=600)
        write_client_files(out, Shard(0, 1), SAMPLES, finished=True)
        st = os.statvfs(vol)
        (vol / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - (1 << 20)))
        d = _drainer(dump, out)
        t = threading.Thread(target=d.run, daemon=True)
        t.start()
        wait_for(
            lambda: "output volume full" in drain_status(out).get("paused_reason", ""),
            60,
            "the drain to pause on the full volume",
            every=0.05,
        )
        d.stop()
        t.join(30)  # a 5 s retry interval: a drain that waits it out twice over has ignored the stop
        stopped_in_time = not t.is_alive()
        in_set = completed_indices(out)
        staged = staged_indices(dump, "hsx", run)
        (vol / "filler").unlink()
        t.join(120)
        assert stopped_in_time, "the drain kept waiting for space after it was asked to stop"
        assert in_set | staged == set(range(SAMPLES)), "a sample is neither in the set nor staged"

        again = threading.Thread(target=_drainer(dump, out).run, daemon=True)
        again.start()
        again.join(120)
        assert completed_indices(out) == set(range(SAMPLES))
