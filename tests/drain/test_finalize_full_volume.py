"""A full output volume when the drain writes the dataset-level files (the speculators Arrow dataset,
the draft vocabulary): it pauses and retries as it does for samples, nothing of a failed build is
left behind, and `hsextract status` calls the run done only once those files cover the set."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path

import pytest
from hsextract.cli import main
from hsextract.drain.core import FINALIZE_FAILED, DrainConfig, Drainer
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from support import volumes
from support.drain_proc import finish_client
from support.staged_dumps import stage_sample

pytestmark = pytest.mark.timeout(300)

SAMPLES = 12


@pytest.fixture
def full_at_finalize(tmp_path):
    """A 4 MiB volume holding an output whose samples are all written, then filled to 16 KiB free:
    room for the drain's status, none for the Arrow dataset. Yields (output, filler, drainer, its
    thread, its exit code holder); the drain runs until the client's summary says the run is over."""
    with volumes.small_volume(tmp_path / "vol", "4m") as vol:
        dump, out = tmp_path / "dump", vol / "out"
        run = load_or_create_run_id(out)
        for i in range(SAMPLES):
            stage_sample(dump, run, i, tokens=150)
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
            )
        )
        rc: list[int] = []
        t = threading.Thread(target=lambda: rc.append(d.run()), daemon=True)
        t.start()
        try:
            _wait(lambda: len(list(iter_entries(out))) == SAMPLES, "every sample in the manifest")
            filler = vol / "filler"
            st = os.statvfs(vol)
            filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - (16 << 10)))
            _finish_client(out)  # the run is over: the drain finalizes and exits
            _wait(
                lambda: "output volume full" in _drain_status(out).get("paused_reason", ""),
                "the drain to pause on the full volume",
            )
            yield out, filler, d, t, rc
        finally:
            d.stop()
            t.join(60)


def test_a_full_volume_at_finalize_pauses_the_drain_until_there_is_space(full_at_finalize, capsys):
    out, filler, _, t, rc = full_at_finalize
    assert t.is_alive(), "the drain waits for space; it does not give up on the dataset-level files"
    headline = _status(out, capsys)[1].splitlines()[0]
    assert headline.startswith(f"The client is done, but the drain is paused (output volume full: {out} has "), (
        "a paused drain's run is not done"
    )
    filler.unlink()
    t.join(120)
    assert not t.is_alive() and rc == [0]
    import datasets

    assert len(datasets.load_from_disk(str(out))) == SAMPLES
    assert not list((out / ".hsextract").glob("arrow-build-*")), "a failed build left its directory"
    code, text = _status(out, capsys)
    assert code == 0 and text.splitlines()[0] == f"The run is done: {SAMPLES} samples are in the training set."


def test_a_drain_stopped_on_a_full_volume_leaves_a_status_that_says_the_files_lag(full_at_finalize, capsys):
    out, filler, d, t, rc = full_at_finalize
    d.stop()
    t.join(120)
    assert not t.is_alive() and rc == [0], "a stop is a stop"
    assert not list((out / ".hsextract").glob("arrow-build-*")), "a failed build left its directory"
    code, text = _status(out, capsys)
    assert code == 1 and not text.startswith("The run is done"), text
    assert (
        f"FAIL: the dataset-level files (the format's, the draft vocabulary's) cover 0 of the {SAMPLES} "
        "samples in the set"
        in text
        and "hsextract finalize --output" in text
    )
    filler.unlink()
    assert main(["finalize", "--output", str(out)]) == 0
    capsys.readouterr()
    code, text = _status(out, capsys)
    assert code == 0 and text.splitlines()[0] == f"The run is done: {SAMPLES} samples are in the training set."


def test_a_finalize_that_fails_otherwise_fails_the_run_and_status_says_so(tmp_path, capsys):
    """Not a full volume: an error the drain cannot wait out (here state.json is a directory)."""
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    for i in range(3):
        stage_sample(dump, run, i)
    (out / "state.json").mkdir()
    _finish_client(out, 3)
    rc = Drainer(
        DrainConfig(
            dump_dir=dump,
            output=out,
            format="speculators",
            workers=1,
            poll_interval_s=0.05,
            finalize_idle_s=3600,
            exit_when_done=True,
        )
    ).run()
    assert rc == FINALIZE_FAILED
    code, text = _status(out, capsys)
    assert code == 1 and not text.startswith("The run is done"), text
    assert (
        "FAIL: the dataset-level files (the format's, the draft vocabulary's) cover 0 of the 3 samples in the "
        "set, so a trainer would not read the others: finalizing failed (IsADirectoryError: " in text
    ), text


def test_the_next_finalize_removes_what_a_failed_build_left(tmp_path, capsys):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    for i in range(3):
        stage_sample(dump, run, i)
    finish_client(out, 3)
    Drainer(
        DrainConfig(
            dump_dir=dump,
            output=out,
            format="speculators",
            workers=1,
            poll_interval_s=0.05,
            finalize_idle_s=3600,
            exit_when_done=True,
        )
    ).run()
    left = out / ".hsextract" / "arrow-build-1873a2b9c0"  # a build killed mid-way (or before this fix)
    (left / "data-00000-of-00001.arrow").parent.mkdir(parents=True)
    (left / "data-00000-of-00001.arrow").write_bytes(b"\0" * 4096)
    assert main(["finalize", "--output", str(out)]) == 0
    assert not left.exists()


def _finish_client(out: Path, samples: int = SAMPLES) -> None:
    """A finished client's files: its summary, which the drain waits for, and its last status."""
    finish_client(out, samples)
    (out / ".hsextract" / "client-status.json").write_text(
        json.dumps({"state": "done", "samples_total": samples, "sent": samples, "ok": samples, "shard": [0, 1]})
    )


def _status(out: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["status", "--output", str(out)])
    return code, capsys.readouterr().out


def _drain_status(out: Path) -> dict:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((out / ".hsextract" / "drain-status.json").read_text())
    return {}


def _wait(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
