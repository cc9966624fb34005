"""What `hsextract pull` writes into its destination: its bookkeeping only into a ``.hsextract`` a
pull made, never through a link another user planted there (a root pull into a shared /tmp path
must not append its journal to any file), and a full volume said with the path and what to do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hsextract.output.manifest import iter_entries, verify_entry
from hsextract.output.run_id import load_or_create_run_id
from support.bucket_sets import drain, target
from support.drain_proc import hsextract
from support.staged_dumps import stage_sample
from support.volumes import resize, small_volume

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _drained(weed, bucket, credentials, tmp_path, n: int = 5, **kw) -> tuple[str, list[str]]:
    dump, work = tmp_path / "dump", tmp_path / "work"
    run = load_or_create_run_id(work)
    for i in range(n):
        stage_sample(dump, run, i, **kw)
    out = target(weed, bucket, "set", credentials)
    assert drain(dump, work, out, lines=n) == 0
    return str(out.url), weed.cli_args(credentials)


def _plant_journal_link(dest: Path, victim: Path, elsewhere: Path) -> None:
    (dest / ".hsextract").mkdir(parents=True)
    (dest / ".hsextract" / "pulled.jsonl").symlink_to(victim)


def _plant_state_dir_link(dest: Path, victim: Path, elsewhere: Path) -> None:
    dest.mkdir()
    (dest / ".hsextract").symlink_to(elsewhere)


def _plant_downloads_link(dest: Path, victim: Path, elsewhere: Path) -> None:
    (dest / ".hsextract").mkdir(parents=True)
    (dest / ".hsextract" / "pull-tmp").symlink_to(elsewhere)


def _plant_other_users_dir(dest: Path, victim: Path, elsewhere: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a directory of another user needs root")
    (dest / ".hsextract").mkdir(parents=True)
    os.chown(dest / ".hsextract", 65534, 65534)


def _other_users_destination(dest: Path, victim: Path, elsewhere: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a directory of another user needs root")
    dest.mkdir()
    os.chown(dest, 65534, 65534)


def _destination_others_may_write(dest: Path, victim: Path, elsewhere: Path) -> None:
    dest.mkdir()
    dest.chmod(0o777)


@pytest.mark.parametrize(
    "plant",
    [
        _plant_journal_link,
        _plant_state_dir_link,
        _plant_downloads_link,
        _plant_other_users_dir,
        _other_users_destination,
        _destination_others_may_write,
    ],
    ids=[
        "journal-link",
        "state-dir-link",
        "downloads-link",
        "other-users-state-dir",
        "other-users-destination",
        "world-writable-destination",
    ],
)
def test_a_pull_refuses_a_destination_prepared_by_someone_else_and_writes_nothing_outside_it(
    weed, bucket, credentials, tmp_path, plant
):
    url, where = _drained(weed, bucket, credentials, tmp_path)
    victim, elsewhere, dest = tmp_path / "victim", tmp_path / "elsewhere", tmp_path / "dest"
    victim.write_text("victim\n")
    elsewhere.mkdir()
    plant(dest, victim, elsewhere)
    r = hsextract("pull", url, str(dest), *where)
    assert r.returncode == 2, r.stderr
    assert "pull into a new directory" in r.stderr, r.stderr
    assert victim.read_text() == "victim\n"
    assert list(elsewhere.iterdir()) == []
    assert not (dest / "hidden_states").exists(), "nothing was pulled"


def test_a_resumed_pull_whose_journal_became_a_link_writes_nothing_through_it(weed, bucket, credentials, tmp_path):
    url, where = _drained(weed, bucket, credentials, tmp_path)
    dest, victim = tmp_path / "dest", tmp_path / "victim"
    assert hsextract("pull", url, str(dest), *where).returncode == 0
    victim.write_text("victim\n")
    journal = dest / ".hsextract" / "pulled.jsonl"
    journal.unlink()
    journal.symlink_to(victim)
    next(iter(sorted((dest / "hidden_states").iterdir()))).unlink()  # a sample to pull again
    r = hsextract("pull", url, str(dest), *where)
    assert r.returncode == 2 and "symbolic link" in r.stderr, r.stderr
    assert victim.read_text() == "victim\n"


def test_a_pull_interrupted_before_it_recorded_its_source_resumes(weed, bucket, credentials, tmp_path):
    url, where = _drained(weed, bucket, credentials, tmp_path)
    dest = tmp_path / "dest"
    (dest / ".hsextract").mkdir(parents=True, mode=0o755)  # what a pull killed right after its mkdir leaves
    r = hsextract("pull", url, str(dest), *where)
    assert r.returncode == 0, r.stderr
    assert all(verify_entry(dest, e) is None for e in iter_entries(dest))


def test_a_full_destination_is_named_and_the_pull_resumes_once_there_is_room(weed, bucket, credentials, tmp_path):
    url, where = _drained(weed, bucket, credentials, tmp_path, n=6, tokens=300, hidden_size=256)  # ~0.6 MB each
    with small_volume(tmp_path / "vol", "1M") as vol:
        dest = vol / "dest"
        r = hsextract("pull", url, str(dest), "--parallel", "1", *where)
        assert r.returncode != 0
        error = r.stderr.strip().splitlines()[-1]
        assert f"{dest}/" in error and "No space left on device" in error and "run the same pull again" in error, error
        resize(vol, "16M")
        again = hsextract("pull", url, str(dest), *where)
        assert again.returncode == 0, again.stderr
        entries = list(iter_entries(dest))
        assert len(entries) == 6 and all(verify_entry(dest, e) is None for e in entries)
