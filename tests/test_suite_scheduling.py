"""How `make test` hands modules to its pytest processes (tests/conftest.py) stays true to the files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load_suite_conftest():
    """tests/conftest.py as a module of its own name (`conftest` may be another directory's)."""
    spec = importlib.util.spec_from_file_location("suite_conftest", ROOT / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


conftest = _load_suite_conftest()


def test_the_modules_grouped_with_the_readers_exist_and_load_a_reader():
    """A renamed module would silently leave the group and load its readers in a second process."""
    for module in conftest.READER_USERS:
        path = ROOT / module
        assert path.is_file(), f"{module} is named in READER_USERS but does not exist"
        assert "support.reader_check import" in path.read_text(), f"{module} loads no reader"


def test_the_reader_modules_and_the_shared_servers_users_go_to_one_process():
    scopes = {conftest._scope_of(f"{m}::test") for m in (*conftest.READER_USERS, "tests/formats/test_real_readers.py",
                                                       "tests/capture/test_server_capture.py")}
    assert scopes == {conftest.SHARED}


def test_a_module_of_neither_kind_is_a_unit_of_its_own():
    assert conftest._scope_of("tests/drain/test_drain_daemon.py::test") == "tests/drain/test_drain_daemon.py"
