"""How `make test` hands modules to its pytest processes (tests/support/scheduling.py) stays true to the files."""

from __future__ import annotations

from pathlib import Path

from support import scheduling

ROOT = Path(__file__).resolve().parents[1]


def test_the_modules_grouped_with_the_readers_exist_and_load_a_reader():
    """A renamed module would silently leave the group and load its readers in a second process."""
    for module in scheduling.READER_USERS:
        path = ROOT / module
        assert path.is_file(), f"{module} is named in READER_USERS but does not exist"
        assert "support.reader_check import" in path.read_text(), f"{module} loads no reader"


def test_the_reader_modules_and_the_shared_servers_users_go_to_one_process():
    users = (*scheduling.READER_USERS, "tests/formats/test_real_readers.py", "tests/capture/test_server_capture.py")
    scopes = {scheduling.scope_of(f"{m}::test") for m in users}
    assert scopes == {scheduling.SHARED}


def test_a_module_of_neither_kind_is_a_unit_of_its_own():
    assert scheduling.scope_of("tests/drain/test_drain_daemon.py::test") == "tests/drain/test_drain_daemon.py"
