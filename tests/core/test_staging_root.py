"""Whoever writes the staging directory (the client, the drain, the units before their services)
refuses one another user could have filled, and what they write there is their user's alone.

Tests run as root: another user's directory here belongs to ``nobody``.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hsextract.staging.announcements import CaptureAnnouncement, write_announcement
from hsextract.staging.fs import prepare_root
from hsextract.staging.records import SampleRecord, write_record

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="making files of another user needs root")]


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def hsextract(*args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(REPO / "files" / "python"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


def _error_line(r: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, r.stderr[-3000:]
    return errors[0]


@pytest.fixture
def squatted(tmp_path) -> Path:
    """A staging directory another user made first, mode 0777, a link planted in it."""
    d = tmp_path / "hsx-squat"
    d.mkdir()
    d.chmod(0o777)
    (d / "_records").symlink_to(tmp_path)
    os.lchown(d / "_records", NOBODY, NOBODY)
    os.chown(d, NOBODY, NOBODY)
    return d


def test_the_client_refuses_a_staging_directory_of_another_user(tmp_path, squatted, tiny_llama):
    (tmp_path / "d.jsonl").write_text('{"input_ids": [1, 2]}\n')
    r = hsextract(
        "-m",
        "hsextract",
        "extract",
        "--server",
        "http://127.0.0.1:9",
        "--dataset",
        str(tmp_path / "d.jsonl"),
        "--model",
        str(tiny_llama),
        "--dump-dir",
        str(squatted),
        "--output",
        str(tmp_path / "out"),
        "--format",
        "specforge",
    )
    assert r.returncode == 2
    line = _error_line(r)
    assert f"staging directory {squatted} belongs to nobody (uid {NOBODY}), mode 0777" in line
    assert f"rm -rf {squatted}" in line
    assert list(tmp_path.glob("*.json")) == [], "nothing was written through the planted link"


def test_the_drain_refuses_a_staging_directory_of_another_user(tmp_path, squatted):
    r = hsextract(
        "-m",
        "hsextract",
        "drain",
        "--dump-dir",
        str(squatted),
        "--output",
        str(tmp_path / "out"),
        "--format",
        "specforge",
        "--exit-when-done",
    )
    assert r.returncode == 2
    assert f"staging directory {squatted} belongs to nobody (uid {NOBODY})" in _error_line(r)


def test_the_drain_refuses_a_staging_directory_others_may_write(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    r = hsextract(
        "-m",
        "hsextract",
        "drain",
        "--dump-dir",
        str(shared),
        "--output",
        str(tmp_path / "out"),
        "--format",
        "specforge",
        "--exit-when-done",
    )
    assert r.returncode == 2
    assert f"staging directory {shared} has mode 0777: its group or others may write into it" in _error_line(r)


def test_records_and_announcements_are_readable_by_their_user_alone(tmp_path):
    dump = tmp_path / "shm" / "dump"
    path = write_record(dump, SampleRecord(rid="hsx-0123abcd-7", index=7, input_ids=[1, 2, 3], loss_mask=[0, 1, 1]))
    ann = write_announcement(
        dump,
        CaptureAnnouncement(
            dump_dir=str(dump),
            rid_prefix="hsx",
            final_hidden="post_norm",
            format="speculators",
            hidden_size=64,
            eagle_aux_hidden_state_layer_ids=[1],
            architecture="x",
            host="h",
            pid=1,
            port=1,
            started_at=0.0,
            proc_start=0,
        ),
    )
    assert _mode(dump) == _mode(path.parent) == _mode(ann.parent) == 0o700
    assert _mode(path) == _mode(ann) == 0o600
    assert json.loads(path.read_text())["index"] == 7


def test_a_record_is_never_written_through_a_planted_records_directory(tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (dump / "_records").symlink_to(elsewhere)
    with pytest.raises(OSError, match="is a symbolic link"):
        write_record(dump, SampleRecord(rid="hsx-0123abcd-7", index=7, input_ids=[1], loss_mask=[1]))
    assert list(elsewhere.iterdir()) == []


def test_a_record_of_a_rid_that_names_another_place_is_refused(tmp_path):
    dump = tmp_path / "dump"
    with pytest.raises(OSError, match="not a plain file name"):
        write_record(dump, SampleRecord(rid="../../escaped", index=7, input_ids=[1], loss_mask=[1]))
    assert not list(tmp_path.rglob("escaped*"))


# ---- the units' step before their service starts (python -m hsextract.ops.staging_root) ----------
def staging_root(owner: str, path: Path) -> subprocess.CompletedProcess:
    return hsextract("-m", "hsextract.ops.staging_root", "--owner", owner, str(path))


def test_the_units_make_a_missing_staging_directory_for_the_service_user_alone(tmp_path):
    d = tmp_path / "shm" / "hsextract"
    r = staging_root("nobody", d)
    assert r.returncode == 0, r.stderr
    st = os.lstat(d)
    assert (st.st_uid, _mode(d)) == (NOBODY, 0o700)


def test_the_units_take_a_root_directory_of_an_earlier_release_for_the_service_user(tmp_path):
    d = tmp_path / "hsextract"
    d.mkdir(mode=0o755)
    r = staging_root("nobody", d)
    assert r.returncode == 0, r.stderr
    assert (os.lstat(d).st_uid, _mode(d)) == (NOBODY, 0o700)


def test_the_units_refuse_a_staging_directory_another_user_made_and_leave_it_theirs(tmp_path, squatted):
    r = staging_root("root", squatted)
    assert r.returncode == 1
    line = _error_line(r)
    assert f"staging directory {squatted} belongs to nobody (uid {NOBODY}), mode 0777, not to root (uid 0)" in line
    assert os.lstat(squatted).st_uid == NOBODY, "never given to the service's user"


def test_the_units_refuse_a_link_in_place_of_the_staging_directory(tmp_path):
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "hsextract"
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)
    r = staging_root("root", link)
    assert r.returncode == 1
    assert f"staging directory {link} is a symbolic link made by nobody (uid {NOBODY})" in _error_line(r)


def test_threads_preparing_one_staging_root_at_once_all_succeed(tmp_path):
    """The first records of a run are written from several threads, each preparing the root: no
    thread's write probe removes another's (they once shared one name, and one failed 'not writable')."""
    root = tmp_path / "dump"
    start = threading.Barrier(16)

    def prepare() -> Path:
        start.wait()
        return prepare_root(root)

    for _ in range(20):
        with ThreadPoolExecutor(max_workers=16) as pool:
            assert set(pool.map(lambda _: prepare(), range(16))) == {root}
    assert [p.name for p in root.iterdir()] == [], "the probes leave nothing behind"
