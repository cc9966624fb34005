"""How `make test` hands the suite's modules to its pytest processes (pytest-xdist, ``--dist loadfile``).

A module keeps its fixtures, sandbox and ordered steps on one process, as xdist's own loadfile does,
except that the modules that use the session's shared SGLang servers (and the small ones that load
the trainers' readers) go to one process together: the suite then starts each shared server and
loads each reader once, not once per process. The longest work starts first, so that none starts
late and ends the run alone on one process. `tests/conftest.py` wires these into pytest's hooks.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The session's shared servers (fixtures of tests/conftest.py).
SESSION_SERVERS = ("llama_server", "llama_prenorm_server", "llama_fp8_server", "dsv3_server")

# The trainers' readers, which a pytest process loads once per reader (`support.reader_check`): about
# 10-30 CPU-seconds of imports each. The small modules that use them go with the shared servers'
# users, where `formats/test_real_readers.py` loads them anyway (the playbooks' modules keep their own
# process).
READER_USERS = (
    "tests/vocab/test_vocab_readers.py",
    "tests/collect/test_collect_readers.py",
    "tests/formats/test_arrow_dataset.py",
)

# The longest work first, longest to shortest: the extract playbook's sandbox (about 12
# process-minutes), the modules that share the shared servers and the readers (about 12, together),
# the fleet (about 7); then every other module, in collection order (docs/testing.md has the minutes).
SHARED = "the modules that use the shared servers or the readers"
START_ORDER = ("tests/ansible/test_extract_playbook.py", SHARED, "tests/ansible/test_fleet.py")


def module_of(nodeid: str) -> str:
    """A node id's file part: ``tests/x/test_y.py``."""
    return nodeid.split("::", 1)[0]


@functools.cache
def uses_session_servers(module: str) -> bool:
    """Whether the test module (a node id's file part) uses a shared server, by fixture argument or
    by `request.getfixturevalue`."""
    path = ROOT / module
    return path.is_file() and any(name in path.read_text(errors="replace") for name in SESSION_SERVERS)


def scope_of(nodeid: str) -> str:
    """What a pytest process takes whole: the test's module, or `SHARED` for the shared servers' and
    the small reader modules' users."""
    module = module_of(nodeid)
    return SHARED if uses_session_servers(module) or module in READER_USERS else module


def start_rank(item: pytest.Item) -> int:
    """Where the test's scope starts in the run: `START_ORDER`'s, then everything else."""
    scope = scope_of(item.nodeid)
    return START_ORDER.index(scope) if scope in START_ORDER else len(START_ORDER)


def make_scheduler(config: pytest.Config, log):
    """xdist's scheduler for ``--dist loadfile`` with `scope_of`'s scopes; None (xdist's own) otherwise."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the collection's order (`start_rank`), not by test count

    class ModulesSharingServers(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ModulesSharingServers(config, log)
