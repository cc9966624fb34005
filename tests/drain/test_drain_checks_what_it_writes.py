"""The drain writes exactly the bytes it proved against the forward pass's fingerprint.

Two ways a wrong sample reached the set (D25): the fingerprint summed a row's words without their
places, so two words of a row swapped, or +x in one and -x in another, passed; and the drain
fingerprinted the staged file's pages and then copied the file again, so a byte changed between
the two was written under a fresh checksum. Both formats' paths are tested: speculators streams
the staged bytes piece by piece, SpecForge reads the rows whole and reorders them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from hsextract.drain.core import DrainConfig, Drainer
from hsextract.formats import get_format
from hsextract.output.layout import drain_tmp_dir
from hsextract.output.manifest import iter_entries, verify_entry
from hsextract.output.run_id import load_or_create_run_id
from hsextract.staging.dumps import DONE_FILE, STATES_FILE, StateFileLayout, read_done_marker, write_done_marker
from hsextract.staging.records import make_rid
from support.client_run import stop, wait_for
from support.drain_proc import finish_client, start
from support.staged_dumps import Staged, stage_sample

pytestmark = pytest.mark.timeout(300)

FORMATS = pytest.mark.parametrize("fmt", ["speculators", "specforge"])
FINAL_HIDDEN = {"speculators": "pre_norm", "specforge": "post_norm"}


def _stage(dump: Path, run: str, index: int, fmt: str, tokens: int = 12) -> Staged:
    return stage_sample(dump, run, index, tokens=tokens, final_hidden=FINAL_HIDDEN[fmt])


def _drain_in_process(dump: Path, out: Path, fmt: str, lines: int) -> Drainer:
    finish_client(out, lines)
    d = Drainer(
        DrainConfig(
            dump_dir=dump,
            output=out,
            format=fmt,
            workers=2,
            worker_mode="threads",
            poll_interval_s=0.05,
            status_interval_s=0.2,
            finalize_idle_s=0.5,
            exit_when_done=True,
            max_failure_share=1.0,
        )
    )
    d.run()
    return d


def _edit_words(dump: Path, staged: Staged, row: int, edit) -> None:
    """Change row `row`'s 64-bit words in the staged file with `edit` (an int64 view of the row)."""
    t, slots, hidden = staged.hidden.shape
    layout = StateFileLayout(t, slots, hidden)
    words = staged.hidden[row].contiguous().view(torch.uint8).view(torch.int64).reshape(-1).clone()
    edit(words)
    with open(dump / staged.rid / STATES_FILE, "r+b") as f:
        f.seek(layout.hidden_offset(row))
        f.write(words.numpy().tobytes())


def _assert_quarantined_alone(out: Path, bad: Staged, good: Staged, d: Drainer) -> None:
    reason = (out / "quarantine" / bad.rid / "reason.txt").read_text().splitlines()
    assert reason[0] == "fingerprint_mismatch" and "the forward pass computed" in reason[1], reason
    assert [e.dataset_index for e in iter_entries(out)] == [good.index]
    assert dict(d.stats.quarantined) == {"fingerprint_mismatch": 1}


@FORMATS
def test_two_words_of_a_row_swapped_in_the_staged_file_are_quarantined(tmp_path, fmt):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    good, bad = _stage(dump, run, 0, fmt), _stage(dump, run, 1, fmt)

    def swap(words: torch.Tensor) -> None:  # bytes 0-7 and 504-511 of the row: aux slot 0 and final slot
        words[[0, 63]] = words[[63, 0]].clone()

    _edit_words(dump, bad, 5, swap)
    _assert_quarantined_alone(out, bad, good, _drain_in_process(dump, out, fmt, lines=2))


@FORMATS
def test_plus_x_in_one_word_and_minus_x_in_another_are_quarantined(tmp_path, fmt):
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    good, bad = _stage(dump, run, 0, fmt), _stage(dump, run, 1, fmt)

    def shift(words: torch.Tensor) -> None:
        words[1] += 2**40
        words[2] -= 2**40

    _edit_words(dump, bad, 7, shift)
    _assert_quarantined_alone(out, bad, good, _drain_in_process(dump, out, fmt, lines=2))


def test_a_dump_fingerprinted_by_an_older_capture_is_refused_naming_the_versions(tmp_path):
    """Version 1 summed the words without their places: checked against version 2 it would fail
    for a reason that is not the rows', so the drain says what differs instead."""
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    good, old = _stage(dump, run, 0, "speculators"), _stage(dump, run, 1, "speculators")
    marker = read_done_marker(dump / old.rid)
    marker.fingerprint, marker.hsextract_version = "0123456789abcdef", "0.9.0"  # how version 1 wrote it
    (dump / old.rid / DONE_FILE).unlink()
    write_done_marker(dump, marker)
    d = _drain_in_process(dump, out, "speculators", lines=2)
    reason = (out / "quarantine" / old.rid / "reason.txt").read_text().splitlines()
    assert reason[0] == "fingerprint_mismatch"
    assert "a version-1 fingerprint (staged by hsextract 0.9.0); this drain checks version 2" in reason[1], reason
    assert [e.dataset_index for e in iter_entries(out)] == [good.index] and d.stats.samples == 1


def _drain_state(out: Path) -> str:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((out / ".hsextract" / "drain-status.json").read_text()).get("state", "")
    return ""


@contextlib.contextmanager
def _read_lease(path: Path):
    """A read lease on `path`: whoever opens it for writing waits until the lease is let go (or the
    kernel's lease-break-time). The breaker's wait is what the test holds the drain in; the kernel
    tells the holder with SIGIO, ignored here (its default would end the test process)."""
    path.write_bytes(b"")
    previous = signal.signal(signal.SIGIO, signal.SIG_IGN)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        yield fd
    finally:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        os.close(fd)
        signal.signal(signal.SIGIO, previous)


@FORMATS
def test_a_byte_changed_once_the_drain_has_read_the_rows_never_reaches_the_set(tmp_path, fmt):
    """The drain reads a dump, checks it and only then opens the sample's temporary file. A read
    lease on that file holds the drain at its open; the test then flips a byte of the staged rows
    and lets the drain go. The sample is either quarantined (a drain that reads the rows after that
    point sees the change) or in the set with the rows the forward pass computed, never with the
    flipped byte."""
    dump, out = tmp_path / "dump", tmp_path / "out"
    run = load_or_create_run_id(out)
    rid = make_rid("hsx", run, 0)
    log = tmp_path / "drain.log"
    dump.mkdir()
    drain = start(
        "drain",
        "--dump-dir",
        str(dump),
        "--output",
        str(out),
        "--format",
        fmt,
        "--exit-when-done",
        "--poll-interval",
        "0.1",
        "--workers",
        "1",
        "--worker-mode",
        "threads",
        "--max-failure-share",
        "1",
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: drain.poll() is not None or _drain_state(out) == "running",
            120,
            "the drain running (its start-up repairs done)",
            log,
        )
        assert drain.poll() is None, log.read_text()[-3000:]
        with _read_lease(drain_tmp_dir(out) / f"{rid}.tmp") as lease:
            staged = _stage(dump, run, 0, fmt, tokens=600)  # a few pieces of rows
            wait_for(
                lambda: drain.poll() is not None or fcntl.fcntl(lease, fcntl.F_GETLEASE) != fcntl.F_RDLCK,
                120,
                "the drain opening the sample's temporary file",
                log,
            )
            assert drain.poll() is None, log.read_text()[-3000:]
            layout = StateFileLayout(*staged.hidden.shape)
            with open(dump / rid / STATES_FILE, "r+b") as f:  # the drain waits at its open: flip a byte
                f.seek(layout.hidden_offset(550) + 1)
                byte = f.read(1)[0]
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([byte ^ 0x01]))
        finish_client(out, 1)
        assert drain.wait(120) in (0, 3), log.read_text()[-3000:]
    finally:
        stop(drain)
    entries = list(iter_entries(out))
    if not entries:
        reason = (out / "quarantine" / rid / "reason.txt").read_text().splitlines()
        assert reason[0] == "fingerprint_mismatch", reason
        return
    [entry] = entries
    assert verify_entry(out, entry) is None
    hidden = _hidden_written(out / entry.file, fmt)
    assert torch.equal(hidden, staged.hidden), "the set holds the rows the drain checked, not the flipped byte"


def _hidden_written(path: Path, fmt: str) -> torch.Tensor:
    if fmt == "speculators":
        from safetensors.torch import load_file

        return load_file(path)["hidden_states"]
    obj = torch.load(path, weights_only=True)
    t = obj["input_ids"].shape[0]
    aux, final = obj["aux_hidden_state"].reshape(t, -1, 64), obj["hidden_state"].reshape(t, 1, 64)
    return torch.cat([aux, final], dim=1)


def test_both_formats_tested_here_are_the_streaming_one_and_a_reordering_one():
    assert getattr(get_format("speculators"), "streams_staged", False)
    assert not getattr(get_format("specforge"), "streams_staged", False)
