"""`hsextract status` on real outputs: the counts of a run that several drain processes wrote, and a
drain paused on a full volume with samples still staged."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hsextract.cli import main
from hsextract.drain.core import DrainConfig, Drainer
from hsextract.output.run_id import load_or_create_run_id
from hsextract.shard import Shard
from support import volumes
from support.client_run import wait_for
from support.drain_proc import drain_status
from support.fleet import HostPlan, drain_host, write_client_files
from support.staged_dumps import stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _status(out: Path, capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["status", "--output", str(out)])
    return code, capsys.readouterr().out.splitlines()


def test_the_table_counts_the_quarantines_of_every_drain_of_the_run_as_the_counts_line_does(tmp_path, capsys):
    """The drain's status file holds its last process's count; a run restarted in a storm has more."""
    out, dump = tmp_path / "out", tmp_path / "dump"
    drain_host(out, dump, "speculators", HostPlan("h", Shard(0, 1), quarantined={2}), 3, range(3))
    drain_host(out, dump, "speculators", HostPlan("h", Shard(0, 1), quarantined={4}), 6, range(3, 6))
    assert drain_status(out)["quarantined"] == 1, "the last drain quarantined one"
    _, lines = _status(out, capsys)
    assert "  quarantined    2, listed in " + str(out / "quarantine") + "/<rid>/reason.txt" in lines
    assert "                 6 accepted = 4 in the set + 0 failed + 2 quarantined" in lines


def test_a_drain_paused_on_a_full_volume_with_samples_staged_is_not_a_finished_run(tmp_path, capsys):
    samples = 12
    with volumes.small_volume(tmp_path / "vol", "4m") as vol:
        dump, out = tmp_path / "dump", vol / "out"
        run = load_or_create_run_id(out)
        for i in range(samples):
            stage_sample(dump, run, i, tokens=600)
        write_client_files(out, Shard(0, 1), samples, finished=True)
        (out / ".hsextract" / "client-status.json").write_text(
            json.dumps({"state": "done", "samples_total": samples, "sent": samples, "ok": samples, "shard": [0, 1]})
        )
        st = os.statvfs(vol)
        (vol / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - (1 << 20)))
        d = Drainer(
            DrainConfig(
                dump_dir=dump,
                output=out,
                format="speculators",
                workers=2,
                poll_interval_s=0.05,
                status_interval_s=0.2,
                finalize_idle_s=3600,
                exit_when_done=True,
                enospc_retry_s=0.2,
                selfcheck_share=0.0,
                selfcheck_first=0,
            )
        )
        t = threading.Thread(target=d.run, daemon=True)
        t.start()
        try:
            wait_for(
                lambda: (
                    "output volume full" in drain_status(out).get("paused_reason", "") and drain_status(out).get("lag")
                ),
                60,
                "the drain to pause on the full volume with samples staged",
                every=0.05,
            )
            _, lines = _status(out, capsys)
        finally:
            # Room again: the drain writes the rest and exits (a drain stopped while paused on a full
            # volume keeps retrying the sample in hand until it has room).
            (vol / "filler").unlink()
            t.join(120)
    assert not lines[0].startswith("The run is done"), lines[0]
    assert lines[0].startswith("The client is done, but the drain is paused (output volume full: "), lines[0]
    assert lines[0].endswith("still wait for the drain."), lines[0]
