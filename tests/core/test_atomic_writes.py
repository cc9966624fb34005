"""A file replaced atomically is, to every reader, the old file or the new one, even when several
threads replace it at once (the client's reporter thread and the end of its run both write the
status files; the drain's committer and its finalize both write the vocabulary checkpoint)."""

from __future__ import annotations

import json
import threading

import pytest
from hsextract.durable import atomic_write_bytes, atomic_write_json

WRITERS = 4
WRITES_EACH = 300


@pytest.mark.parametrize("durable", [False, True], ids=["plain", "durable"])
def test_concurrent_writers_never_show_a_reader_a_partial_or_missing_file(tmp_path, durable):
    path = tmp_path / "state" / "status.json"
    atomic_write_json(path, {"writer": -1, "n": -1, "pad": ""}, durable=durable)
    errors: list[str] = []
    stop = threading.Event()

    def write(w: int) -> None:
        try:
            for n in range(WRITES_EACH if not durable else WRITES_EACH // 10):
                # sizes differ between writers, so a torn or interleaved write would not parse
                atomic_write_json(path, {"writer": w, "n": n, "pad": "x" * (1000 * (w + 1))}, durable=durable)
        except Exception as exc:
            errors.append(f"writer {w}: {exc!r}")

    def read() -> None:
        reads = 0
        while not stop.is_set() or reads == 0:
            try:
                data = json.loads(path.read_text())
            except FileNotFoundError:
                errors.append("the file was missing")
                return
            except ValueError as exc:
                errors.append(f"a partial file: {exc}")
                return
            w = data["writer"]
            if w >= 0 and len(data["pad"]) != 1000 * (w + 1):
                errors.append(f"writer {w}'s file with another's contents")
                return
            reads += 1

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    reader.join()
    assert not errors, errors
    assert json.loads(path.read_text())["writer"] >= 0
    assert [p.name for p in path.parent.iterdir()] == ["status.json"], "temporary files were left behind"


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "status.json"
    atomic_write_bytes(path, b"old")
    with pytest.raises(TypeError):
        atomic_write_bytes(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def test_a_dead_writers_temporary_is_removed_by_the_next_process_and_a_live_ones_is_kept(tmp_path):
    import os
    import subprocess
    import sys

    from hsextract import durable

    path = tmp_path / "client-status.json"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        host = durable._HOST
        orphan = tmp_path / f".{path.name}.{host}.{int(dead.stdout)}.1.0.tmp"  # killed before its rename
        busy = tmp_path / f".{path.name}.{host}.{live.pid}.1.0.tmp"  # a live writer's, mid-write
        remote = tmp_path / f".{path.name}.otherhost.{int(dead.stdout)}.1.0.tmp"  # not this host's to judge
        for f in (orphan, busy, remote):
            f.write_text("{")
        assert durable.remove_orphaned_temporaries(path) == [orphan]
        assert not orphan.exists() and busy.exists() and remote.exists()
        assert os.getpid() != int(dead.stdout)
    finally:
        live.communicate(b"")
