"""The capture writes only into a staging directory its own user made, never through what another
user planted there, and leaves what it stages readable by that user alone.

Any local user can create the default staging directory (/dev/shm/hsextract) before the service
does and plant links in it named as the dumps of a run (its id is in the world-readable run.json).
Tests run as root: another user's files here belong to ``nobody``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hsextract.capture.core import BatchRequest
from hsextract.capture.preflight import check_dump_dir
from hsextract.errors import ConfigError
from hsextract.staging.dumps import DONE_FILE, FAILED_FILE, STATES_FILE, read_done_marker, read_states
from support.capture_writers import MODES, batch, make_writer

NOBODY = 65534
RUN = "feedbeef00000001"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="making files of another user needs root")]


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_capture_creates_its_staging_directory_for_its_user_alone(tmp_path):
    d = check_dump_dir(tmp_path / "shm" / "hsextract")
    assert _mode(d) == 0o700 and os.lstat(d).st_uid == os.geteuid()


def test_a_staging_directory_of_another_user_is_refused_saying_whose_it_is_and_what_to_do(tmp_path, mode):
    squat = tmp_path / "squat"
    squat.mkdir(mode=0o700)
    os.chown(squat, NOBODY, NOBODY)
    for refuse in (lambda: check_dump_dir(squat), lambda: make_writer(squat, mode)):
        with pytest.raises(ConfigError) as refused:
            refuse()
        message = str(refused.value)
        assert f"staging directory {squat} belongs to" in message and f"uid {NOBODY}" in message
        assert "mode 0700" in message and f"rm -rf {squat}" in message


def test_a_staging_directory_that_others_may_write_is_refused(tmp_path, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(ConfigError, match=r"has mode 1777: its group or others may write into it"):
        check_dump_dir(shared)
    with pytest.raises(ConfigError, match="has mode 1777"):
        make_writer(shared, mode)


def _victim(path: Path) -> Path:
    path.write_text("root-only content\n")
    path.chmod(0o600)
    return path


def test_links_planted_in_the_staging_directory_are_never_written_through(tmp_path, mode):
    """The directory is the service's now (``install -d -o`` adopted the squatted one, or the
    squatter's user is the service's), but what was planted in it is still there."""
    victim = _victim(tmp_path / "victim.txt")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dump = tmp_path / "dump"
    dump.mkdir(mode=0o700)
    theirs = dump / f"hsx-{RUN}-1"  # a request's directory of another user, holding a link
    theirs.mkdir()
    (theirs / STATES_FILE).symlink_to(victim)
    os.lchown(theirs / STATES_FILE, NOBODY, NOBODY)
    os.chown(theirs, NOBODY, NOBODY)
    (dump / f"hsx-{RUN}-2").symlink_to(elsewhere)  # a link in place of a request's directory
    ours = [dump / f"hsx-{RUN}-{i}" for i in (3, 4)]  # directories of the capture's user, links inside
    for d in ours:
        d.mkdir(mode=0o700)
        for name in (STATES_FILE, DONE_FILE, f".{DONE_FILE}.tmp"):
            (d / name).symlink_to(victim)
    w = make_writer(dump, mode)
    aux, final, ids = batch(16, seed=21)
    try:
        for rid in (f"hsx-{RUN}-{i}" for i in (1, 2, 3)):  # each in one piece
            w.submit([BatchRequest(rid, 0, 0, 16, 0)], aux, final, ids, [16])
        for start in (0, 8):  # in two chunks: its file is created at full size first
            w.submit(
                [BatchRequest(f"hsx-{RUN}-4", 0, start, 8, 0)],
                aux[start : start + 8],
                final[start : start + 8],
                ids[start : start + 8],
                [16],
            )
        assert w.flush(timeout=30)
    finally:
        w.close()
    assert victim.read_text() == "root-only content\n" and _mode(victim) == 0o600
    assert list(elsewhere.iterdir()) == []
    assert os.path.islink(theirs / STATES_FILE) and not (theirs / DONE_FILE).exists()
    for d in ours:  # the links were replaced by the capture's own files
        assert not (d / STATES_FILE).is_symlink() and not (d / DONE_FILE).is_symlink()
        st = read_states(d)
        assert st.input_ids.tolist() == ids.tolist() and read_done_marker(d).prompt_len == 16


def test_staged_dumps_and_markers_are_readable_by_the_capture_user_alone(tmp_path, mode):
    dump = check_dump_dir(tmp_path / "dump")
    w = make_writer(dump, mode)
    aux, final, ids = batch(8, seed=22)
    done, failed = f"hsx-{RUN}-0", f"hsx-{RUN}-1"
    try:
        w.submit([BatchRequest(done, 0, 0, 8, 0)], aux, final, ids, [8])
        w.fail_requests([BatchRequest(failed, 0, 0, 8, 0)], "queue_error", "a test's failure")
        assert w.flush(timeout=30)
    finally:
        w.close()
    assert _mode(dump / done) == _mode(dump / failed) == 0o700
    assert {p.name: _mode(p) for p in [*(dump / done).iterdir(), *(dump / failed).iterdir()]} == {
        STATES_FILE: 0o600,
        DONE_FILE: 0o600,
        FAILED_FILE: 0o600,
    }


def test_the_writer_takes_no_rid_that_would_name_another_place(tmp_path):
    """The capture selects only the client's rids (test_core); the writer, fed directly, still
    joins none that is not one plain name into a path."""
    dump = check_dump_dir(tmp_path / "shm" / "dump")
    w = make_writer(dump)
    aux, final, ids = batch(8, seed=23)
    try:
        for rid in ("hsx-x/../../../escaped", "..", "hsx-a/b"):
            w.submit([BatchRequest(rid, 0, 0, 8, 0)], aux, final, ids, [8])
        assert w.flush(timeout=30)
    finally:
        w.close()
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "shm" / "escaped").exists()
    assert sorted(p.name for p in dump.iterdir()) == []
