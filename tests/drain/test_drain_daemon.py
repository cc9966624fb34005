"""The drain daemon's behaviour on staged dumps written through the staging contract."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
import torch
from hsextract import fingerprint
from hsextract.drain.core import DrainConfig, Drainer
from hsextract.errors import ConfigError
from hsextract.output.manifest import entries_path, iter_entries, read_header, verify_entry
from hsextract.output.run_id import load_or_create_run_id
from hsextract.staging.dumps import StateFileLayout
from safetensors.torch import load_file
from support import volumes
from support.drain_proc import finish_client, hsextract, start
from support.staged_dumps import restamp_fingerprint, stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _cfg(dump: Path, out: Path, **kw) -> DrainConfig:
    base = dict(
        dump_dir=dump,
        output=out,
        format="speculators",
        workers=3,
        poll_interval_s=0.05,
        status_interval_s=0.2,
        finalize_idle_s=0.5,
        exit_when_done=True,
    )
    base.update(kw)
    return DrainConfig(**base)


def _drain(dump: Path, out: Path, lines: int = 100, **kw) -> Drainer:
    finish_client(out, lines)
    # With processes, every sample through them (not the drain's threads while they start).
    d = Drainer(_cfg(dump, out, wait_for_worker_processes=kw.get("worker_mode") == "processes", **kw))
    d.run()
    return d


def _staged_names(dump: Path) -> list[str]:
    return sorted(p.name for p in dump.iterdir() if p.name != "_records") if dump.exists() else []


# The workers as threads of the drain, and as its worker processes (hsextract.drain.worker_processes).
WORKER_MODES = pytest.mark.parametrize("worker_mode", ["threads", "processes"])


@WORKER_MODES
def test_each_complete_dump_is_written_once_in_order_and_leaves_staging(tmp_path, worker_mode):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    staged = {i: stage_sample(dump, run, i, tokens=3 + i) for i in range(25)}
    _drain(dump, out, worker_mode=worker_mode)
    entries = list(iter_entries(out))
    assert [e.output_index for e in entries] == list(range(25))
    assert sorted(e.dataset_index for e in entries) == list(range(25))
    for e in entries:
        want = staged[e.dataset_index]
        got = load_file(out / e.file)
        assert torch.equal(got["hidden_states"], want.hidden)
        assert got["token_ids"].dtype == torch.int64 and torch.equal(got["token_ids"], want.input_ids)
        assert verify_entry(out, e) is None
    assert _staged_names(dump) == [] and list((dump / "_records").iterdir()) == []
    assert not list((out / ".hsextract" / "tmp").iterdir())


def test_stale_dumps_of_this_run_are_removed_and_never_written(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    stage_sample(dump, run, 0)
    _drain(dump, out)
    stage_sample(dump, run, 0, seed=99)  # the same sample again: already written
    stage_sample(dump, run, 2, record=False)  # no client record, past the grace period
    d = _drain(dump, out, record_grace_s=0.0)
    assert [e.dataset_index for e in iter_entries(out)] == [0]
    assert _staged_names(dump) == []
    assert dict(d.stats.stale_removed) == {"already written": 1, "no client record": 1}


def test_dumps_of_other_runs_are_left_alone_and_reported(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    stage_sample(dump, run, 0)
    other = stage_sample(dump, "0badc0de", 1)  # another run's dump: its own drain takes it
    (dump / "HEALTH_CHECK_1").mkdir()  # not a client request at all: not this run's either
    d = _drain(dump, out, record_grace_s=0.0)
    assert [e.dataset_index for e in iter_entries(out)] == [0]
    assert _staged_names(dump) == sorted(["HEALTH_CHECK_1", other.rid])
    assert (dump / "_records" / f"{other.rid}.json").exists(), "its record stays too"
    assert dict(d.stats.stale_removed) == {}
    status = json.loads((out / ".hsextract" / "drain-status.json").read_text())
    assert status["foreign"] == {"run 0badc0de": 1, "unknown": 1}


def test_a_torn_manifest_line_and_an_unrecorded_file_are_repaired_at_start(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    for i in range(3):
        stage_sample(dump, run, i)
    _drain(dump, out)
    # The crash: sample 3's file was renamed into place, its manifest line only half written.
    last = entries_path(out).read_bytes().splitlines()[-1]
    with open(entries_path(out), "ab") as f:
        f.write(last.replace(b'"output_index":2', b'"output_index":3')[:30])
    (out / "hidden_states" / "hs_3.safetensors").write_bytes(b"half a sample")
    want = stage_sample(dump, run, 3)  # ...so its dump is still staged
    _drain(dump, out)
    entries = list(iter_entries(out))
    assert sorted(e.dataset_index for e in entries) == [0, 1, 2, 3] and entries[3].dataset_index == 3
    assert all(verify_entry(out, e) is None for e in entries)
    assert torch.equal(load_file(out / entries[3].file)["hidden_states"], want.hidden)


def test_resuming_an_output_dir_with_other_layers_is_refused(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    stage_sample(dump, load_or_create_run_id(out), 0)
    _drain(dump, out)
    with pytest.raises(ConfigError, match="eagle layer ids"):
        _drain(dump, out, eagle_layer_ids=(1, 2, 5))


def test_the_client_summary_is_awaited_before_exit_when_done(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    stage_sample(dump, load_or_create_run_id(out), 0)
    d = Drainer(_cfg(dump, out))
    asked = threading.Semaphore(0)
    client_finished = d._client_finished

    def counted() -> bool:
        answer = client_finished()
        asked.release()
        return answer

    d._client_finished = counted
    t = threading.Thread(target=d.run)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while [e.dataset_index for e in iter_entries(out)] != [0]:
            assert time.monotonic() < deadline, "the staged sample was never written"
            time.sleep(0.05)
        while asked.acquire(blocking=False):  # asked before the sample was in: not the state meant
            pass
        for _ in range(3):  # with its sample written, the drain asked three more times and was told no
            assert asked.acquire(timeout=60), "the drain never asked whether the client had finished"
        assert t.is_alive(), "exited before the client said it had finished"
        finish_client(out, 1)
        t.join(10)
        assert not t.is_alive()
    finally:
        d.stop_event.set()
        t.join(10)


@pytest.fixture
def small_volume(tmp_path):
    """A 4 MiB tmpfs: a volume the drain can fill."""
    with volumes.small_volume(tmp_path / "vol", "4m") as mnt:
        yield mnt


@WORKER_MODES
def test_a_full_output_volume_pauses_the_drain_until_space_returns(tmp_path, small_volume, worker_mode):
    dump, out = tmp_path / "dump", small_volume / "out"
    run = load_or_create_run_id(out)
    staged = {i: stage_sample(dump, run, i, tokens=200) for i in range(12)}  # ~205 KB each
    filler = small_volume / "filler"
    free = os.statvfs(small_volume).f_bavail * os.statvfs(small_volume).f_frsize
    filler.write_bytes(b"\0" * (free - 700_000))  # room for ~3 samples
    d = Drainer(
        _cfg(
            dump,
            out,
            format="speculators",
            enospc_retry_s=0.2,
            finalize_idle_s=3600,
            worker_mode=worker_mode,
            wait_for_worker_processes=worker_mode == "processes",
        )
    )
    t = threading.Thread(target=d.run)
    t.start()
    try:
        deadline = time.monotonic() + 60
        status = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, ValueError):
                status = json.loads((out / ".hsextract" / "drain-status.json").read_text())
            if status.get("paused_reason"):
                break
            time.sleep(0.1)
        assert "output volume full" in status.get("paused_reason", ""), status
        assert str(out) in status["paused_reason"] and "bytes free" in status["paused_reason"]
        assert len(_staged_names(dump)) > 0  # nothing deleted that is not written
        filler.unlink()
        finish_client(out, 100)
        t.join(60)
        assert not t.is_alive()
    finally:
        d.stop_event.set()
        t.join(10)
    entries = list(iter_entries(out))
    assert sorted(e.dataset_index for e in entries) == sorted(staged)
    assert all(verify_entry(out, e) is None for e in entries)
    assert _staged_names(dump) == []


class _LogLines:
    """A process's stderr, read line by line as it comes (a pipe left unread would block the process)."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self.ended = False  # the process closed its end (exited)
        self._cv = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._cv:
                self.lines.append(line)
                self._cv.notify_all()
        with self._cv:
            self.ended = True
            self._cv.notify_all()

    def wait_for(self, text: str, timeout: float) -> None:
        def seen() -> bool:
            return any(text in line for line in self.lines)

        with self._cv:
            self._cv.wait_for(lambda: seen() or self.ended, timeout)
            found = seen()
        assert found, f"no log line with {text!r} within {timeout} s:\n{self.text()[-3000:]}"

    def text(self) -> str:
        with self._cv:
            return "".join(self.lines)


@WORKER_MODES
def test_sigterm_finishes_the_samples_in_hand_and_exits_zero(tmp_path, worker_mode):
    """systemd sends SIGTERM to every process of the unit: worker processes too leave the stop to the drain."""
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    first, later = 150, 50  # staged before the stop, and while the drain is frozen just before it
    total = first + later
    dump.mkdir(parents=True)  # as the capture makes it
    proc = start(
        "drain",
        "--dump-dir",
        str(dump),
        "--output",
        str(out),
        "--format",
        "speculators",
        "--workers",
        "2",
        "--worker-mode",
        worker_mode,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    log = _LogLines(proc.stderr)
    try:
        # The samples come once the workers are up (worker processes start in the background, the drain's
        # threads preparing the first samples meanwhile): the stop must find samples in the processes' hands.
        log.wait_for("samples are prepared in them" if worker_mode == "processes" else "draining ", 120)
        for i in range(first):
            stage_sample(dump, run, i, tokens=200)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list(iter_entries(out))) < 5:
            time.sleep(0.05)
        # Frozen, the drain cannot finish the backlog before the stop lands, however fast it is or
        # however slowly this test runs: the samples staged now are still there when it stops.
        os.killpg(proc.pid, signal.SIGSTOP)
        for i in range(first, total):
            stage_sample(dump, run, i, tokens=200)
        os.killpg(proc.pid, signal.SIGTERM)  # as systemd's stop does: the drain and every process it started
        os.killpg(proc.pid, signal.SIGCONT)
        rc = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, log.text()[-3000:]
    entries = list(iter_entries(out))
    assert 5 <= len(entries) < total, "SIGTERM should stop the drain before it empties the backlog"
    assert all(verify_entry(out, e) is None for e in entries)
    written = {e.rid for e in entries}
    assert written.isdisjoint(_staged_names(dump))
    assert len(written) + len(_staged_names(dump)) == total
    assert json.loads((out / ".hsextract" / "drain-status.json").read_text())["state"] == "stopped"


def test_status_command_reports_progress_and_fails_when_the_drain_is_silent(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    for i in range(4):
        stage_sample(dump, run, i)
    _drain(dump, out, lines=4)
    (out / ".hsextract" / "client-status.json").write_text(json.dumps({"state": "done", "sent": 4}))
    r = hsextract("status", "--output", str(out), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("The run is done: 4 samples are in the training set.\n"), r.stdout
    assert "4 accepted = 4 in the set + 0 failed + 0 quarantined" in r.stdout, r.stdout
    status_file = out / ".hsextract" / "drain-status.json"
    st = json.loads(status_file.read_text())
    st.update(state="running", updated_at=time.time() - 600)
    status_file.write_text(json.dumps(st))
    r = hsextract("status", "--output", str(out), "--stale-after", "60", timeout=60)
    assert r.returncode == 1 and "stale" in r.stdout


def test_metrics_are_served_as_prometheus_text_on_localhost(tmp_path, free_port):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    for i in range(3):
        stage_sample(dump, run, i, tokens=7)
    port = free_port()
    d = Drainer(_cfg(dump, out, exit_when_done=False, metrics_port=port))
    t = threading.Thread(target=d.run)
    t.start()
    try:
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline and "hsextract_drain_samples_total 3" not in text:
            with contextlib.suppress(requests.RequestException):
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            time.sleep(0.1)
    finally:
        d.stop_event.set()
        t.join(20)
    assert "hsextract_drain_samples_total 3" in text
    assert "hsextract_drain_tokens_total 21" in text
    assert "# TYPE hsextract_drain_lag_dumps gauge" in text


def test_an_output_dir_records_its_configuration_in_the_manifest_header(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    stage_sample(dump, load_or_create_run_id(out), 0)
    _drain(dump, out)
    h = read_header(out)
    assert (h.format, h.final_hidden, h.dtype) == ("speculators", "pre_norm", "bfloat16")
    assert (h.hidden_size, h.num_aux) == (64, 3)
    assert (h.eagle_aux_hidden_state_layer_ids, h.sglang_layers_to_capture) == ([1, 3, 4], [2, 4, 5])
    assert h.sglang_version == "0.5.23"


@WORKER_MODES
def test_a_nan_met_while_streaming_rows_quarantines_the_dump_and_leaves_no_file(tmp_path, worker_mode):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    stage_sample(dump, run, 0, tokens=3000)
    bad = stage_sample(dump, run, 1, tokens=3000)  # 1.5 MB of rows: streamed in more than one piece
    layout = StateFileLayout(prompt_len=3000, num_slots=4, hidden_size=64)
    with open(dump / bad.rid / "states.safetensors", "r+b") as f:
        f.seek(layout.hidden_offset(2999) + 2 * 64)  # slot 1 of the last token
        f.write(torch.full((64,), float("nan"), dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes())
    restamp_fingerprint(dump / bad.rid)  # a NaN the forward pass itself computed
    d = _drain(dump, out, worker_mode=worker_mode)
    reason = (out / "quarantine" / bad.rid / "reason.txt").read_text().splitlines()
    assert reason[0] == "non_finite" and "token 2999" in reason[1]
    assert [e.dataset_index for e in iter_entries(out)] == [0]
    assert sorted(p.name for p in (out / "hidden_states").iterdir()) == ["hs_0.safetensors"]
    assert not list((out / ".hsextract" / "tmp").iterdir())
    assert dict(d.stats.quarantined) == {"non_finite": 1}


def test_rows_changed_after_the_forward_pass_are_quarantined_as_a_fingerprint_mismatch(tmp_path):
    """The capture fingerprints each sample's rows inside the forward pass; a staged file that holds
    anything else (another batch's rows, a corrupted copy) never reaches the training set."""
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    stage_sample(dump, run, 0)
    bad = stage_sample(dump, run, 1)
    layout = StateFileLayout(prompt_len=12, num_slots=4, hidden_size=64)
    with open(dump / bad.rid / "states.safetensors", "r+b") as f:  # two rows swapped
        f.seek(layout.hidden_offset(3))
        f.write(bad.hidden[7].contiguous().view(torch.uint8).numpy().tobytes())
        f.seek(layout.hidden_offset(7))
        f.write(bad.hidden[3].contiguous().view(torch.uint8).numpy().tobytes())
    d = _drain(dump, out)
    reason = (out / "quarantine" / bad.rid / "reason.txt").read_text().splitlines()
    assert reason[0] == "fingerprint_mismatch" and "the forward pass computed" in reason[1]
    assert [e.dataset_index for e in iter_entries(out)] == [0]
    assert dict(d.stats.quarantined) == {"fingerprint_mismatch": 1}


def test_the_manifest_keeps_each_samples_fingerprint(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    staged = stage_sample(dump, load_or_create_run_id(out), 0)
    _drain(dump, out)
    [entry] = list(iter_entries(out))
    assert entry.fingerprint == fingerprint.of_states(staged.hidden, staged.input_ids)


def test_the_workers_do_not_wait_for_the_poll_interval_between_samples(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    for i in range(30):  # many more than the workers' queue holds (2 per worker)
        stage_sample(dump, run, i)
    t0 = time.monotonic()
    d = _drain(dump, out, workers=1, poll_interval_s=5.0)
    took = time.monotonic() - t0
    assert d.stats.samples_total == 30
    # Waiting for the next scheduled scan once per queue-full would take 15 intervals (75 s).
    assert took < 5.0 * 3, f"draining 30 small samples took {took:.1f} s with a 5 s poll interval"


def test_a_crash_between_quarantining_a_dump_and_removing_it_does_not_quarantine_it_twice(tmp_path, monkeypatch):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    stage_sample(dump, run, 0)
    bad = stage_sample(dump, run, 1, eagle_ids=[2, 3, 4])  # captured at other layers than configured

    def killed_before_removal(d):
        raise RuntimeError("simulated crash after the quarantine copy")

    monkeypatch.setattr("hsextract.drain.quarantine.discard_dump", killed_before_removal)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _drain(dump, out, eagle_layer_ids=(1, 3, 4), workers=1)
    assert (out / "quarantine" / bad.rid / "reason.txt").exists() and (dump / bad.rid).exists()
    monkeypatch.undo()
    d = _drain(dump, out, eagle_layer_ids=(1, 3, 4))
    assert sorted(p.name for p in (out / "quarantine").iterdir()) == [bad.rid]
    assert _staged_names(dump) == []
    assert [e.dataset_index for e in iter_entries(out)] == [0]
    assert dict(d.stats.quarantined) == {}  # counted by the process that quarantined it


def test_a_partial_dump_of_a_sample_the_finished_client_gave_up_on_does_not_hold_up_exit(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    stage_sample(dump, run, 0)
    given_up = stage_sample(dump, run, 1, done=False)  # the server aborted it midway
    finish_client(out, 2)
    (out / ".hsextract" / "failures.jsonl").write_text(
        json.dumps({"index": 1, "line": 2, "rid": given_up.rid, "reason": "aborted", "attempts": 4}) + "\n"
    )
    t0 = time.monotonic()
    d = _drain(dump, out, abandoned_grace_s=1.0)  # incomplete_timeout_s stays 30 min
    assert time.monotonic() - t0 < 60
    reason = (out / "quarantine" / given_up.rid / "reason.txt").read_text()
    assert reason.startswith("incomplete\n") and "failures.jsonl" in reason
    assert [e.dataset_index for e in iter_entries(out)] == [0]
    assert _staged_names(dump) == [] and dict(d.stats.quarantined) == {"incomplete": 1}


def test_status_fails_a_finished_run_whose_counts_do_not_add_up(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    for i in range(4):
        stage_sample(dump, run, i)
    _drain(dump, out, lines=6)  # the client says 6 lines, 2 of which are nowhere
    r = hsextract("status", "--output", str(out), timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "6 accepted = 4 in the set + 0 failed + 0 quarantined + 2 UNACCOUNTED" in r.stdout
    assert "dataset indices 4, 5" in r.stdout


def test_a_worker_process_killed_mid_run_stops_the_drain_saying_so_and_a_restart_writes_the_rest(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    total = 300  # seconds of work: the kill lands long before the drain could finish
    for i in range(total):
        stage_sample(dump, run, i, tokens=200)
    finish_client(out, total)
    d = Drainer(_cfg(dump, out, worker_mode="processes", workers=2, wait_for_worker_processes=True))
    raised: list[BaseException] = []

    def run_drain() -> None:
        try:
            d.run()
        except BaseException as exc:  # what the daemon's command would report
            raised.append(exc)

    t = threading.Thread(target=run_drain)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list(iter_entries(out))) < 3:
            time.sleep(0.05)
        assert d._processes is not None and d._processes.pids
        os.kill(d._processes.pids[0], signal.SIGKILL)  # as the kernel's OOM killer would
        t.join(60)
        assert not t.is_alive()
    finally:
        d.stop()
        t.join(10)
    assert raised and "a drain worker process died" in str(raised[0]) and "stays staged" in str(raised[0])
    entries = list(iter_entries(out))
    assert all(verify_entry(out, e) is None for e in entries)
    written = {e.rid for e in entries}
    assert len(written) < total and written.isdisjoint(_staged_names(dump))
    assert len(written) + len(_staged_names(dump)) == total  # nothing lost: written, or still staged

    _drain(dump, out, lines=total, worker_mode="threads")  # the restart
    assert sorted(e.dataset_index for e in iter_entries(out)) == list(range(total))
    assert _staged_names(dump) == []


def test_the_workers_are_processes_only_on_a_machine_with_the_cores_for_them(monkeypatch):
    from hsextract.drain.config import PROCESSES_FROM_CORES

    cfg = DrainConfig(dump_dir=Path("d"), output=Path("o"), format="speculators", workers=4)
    monkeypatch.setattr(os, "cpu_count", lambda: PROCESSES_FROM_CORES - 1)
    assert cfg.worker_processes == 0 and cfg.worker_threads == 4
    monkeypatch.setattr(os, "cpu_count", lambda: PROCESSES_FROM_CORES)
    assert cfg.worker_processes == 4 and cfg.worker_threads == 16
    assert (
        DrainConfig(
            dump_dir=Path("d"), output=Path("o"), format="speculators", workers=4, worker_mode="threads"
        ).worker_processes
        == 0
    )
