"""Shared fixtures: tiny models and real SGLang servers on CPU with the capture on.

* ``tiny_llama`` / ``tiny_dsv3``: model directories generated once into
  ``.work/models/<kind>-<hash of tiny_model.py>`` under the repository (reused across runs,
  regenerated when the generator changes).
* ``llama_server`` / ``dsv3_server``: one server each per test session, started on first use,
  dumping into a session temporary directory, rid prefix ``hsx`` (DeepSeek's final state pre-norm);
  stopped at session end, also when tests fail. Tests that share them use rids
  ``hsx-<fresh run id>-<i>`` and remove their dumps.
* ``free_port``: a function returning a free port of this suite's range, for tests that start
  their own server with `support.sglang_server.start_server`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "files" / "python", REPO / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from support.sglang_server import PRENORM_SGLANG_LAYERS, ServerHandle, start_server, wait_stopped  # noqa: E402
from support.sglang_server import free_port as _free_port  # noqa: E402

# Ports of the shared server fixtures and of tests that start their own servers.
PORT_RANGE = (
    int(os.environ.get("HSEXTRACT_TEST_PORT_LO", "31000")),
    int(os.environ.get("HSEXTRACT_TEST_PORT_HI", "31099")),
)


# Host buffers in 1 KiB steps instead of 2 MiB: the tiny models' batches (a few KiB) then leave
# free buffers of different sizes in the capture's pool, as production batches do.
SESSION_CAPTURE_EXTRA = {"pool_granularity_bytes": 1024}


def _models_root() -> Path:
    return Path(os.environ.get("HSEXTRACT_MODEL_CACHE", REPO / ".work" / "models"))


def _tiny_model(kind: str) -> Path:
    from hsextract import tiny_model

    digest = hashlib.sha256(Path(tiny_model.__file__).read_bytes()).hexdigest()[:12]
    path = _models_root() / f"{kind}-{digest}"
    lock = path.with_name(path.name + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    import fcntl

    with open(lock, "w") as fh:  # several pytest processes may build the same model at once
        fcntl.flock(fh, fcntl.LOCK_EX)
        tiny_model.ensure_tiny_model(kind, path)
    return path


# Modules whose tests start processes (the hsextract CLI, ansible-playbook, the trainers' readers,
# kill loops, child writer processes): seconds each, so the fast tier (`make test-fast`) leaves them
# out with the servers and sandboxes. `make test` runs them all.
SLOW_MODULES = {
    "ansible/test_bad_settings_play.py", "ansible/test_capture_patch_role.py",
    "ansible/test_collect_playbook.py",
    "ansible/test_output_dataset_check.py", "ansible/test_plan_role.py", "ansible/test_server_profiles.py",
    "ansible/test_unit_paths.py", "ansible/test_client_processes_role.py", "ansible/test_extract_playbook.py",
    "ansible/test_fleet.py", "ansible/test_service_handlers_states.py",
    "ansible/test_fleet_inventory.py", "fleet/test_fleet_command.py",
    "capture/test_announcement.py", "capture/test_writer.py", "capture/test_writer_process.py",
    "capture/test_host_pool.py", "capture/test_patch.py",
    "client/test_one_client_per_shard.py", "client/test_stop_signals.py",
    "collect/test_collect.py", "collect/test_collect_processes.py", "collect/test_collect_bad_input.py",
    "collect/test_collect_kill.py",
    "collect/test_collect_readers.py",
    "core/test_bad_settings.py", "core/test_packaging.py", "core/test_reader_gone.py",
    "drain/test_crash_safety.py", "drain/test_drain_daemon.py", "drain/test_exit_when_done.py",
    "drain/test_one_writer_per_output.py", "drain/test_what_staging_holds.py",
    "formats/test_arrow_dataset.py", "gpu_tier/test_gpu_tier.py",
    "objectstore/test_drain_to_bucket.py", "objectstore/test_server_checks.py",
    "objectstore/test_faults.py", "objectstore/test_bucket_status_verify.py",
    "objectstore/test_pull.py", "objectstore/test_collect_in_place.py", "plan/test_plan.py",
    "vocab/test_vocab_drain.py", "vocab/test_vocab_readers.py", "test_docs.py",
}


# The session's shared servers (below). Each pytest process of `make test` that runs a test using
# one starts its own: about 35 CPU-seconds of start, and 1 CPU-second a minute while it idles.
SESSION_SERVERS = ("llama_server", "llama_prenorm_server", "dsv3_server")
# The shared servers this process started: paused (`ServerHandle.pause`) while its tests are
# elsewhere, and after the last of them.
_started: list[ServerHandle] = []


def _module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@functools.cache
def _uses_session_servers(module: str) -> bool:
    """Whether the test module (a node id's file part) uses a shared server, by fixture argument or
    by `request.getfixturevalue`."""
    path = Path(__file__).resolve().parent.parent / module
    return path.is_file() and any(name in path.read_text(errors="replace") for name in SESSION_SERVERS)


# The trainers' readers, which a pytest process loads once per reader (`support.reader_check`): about
# 10-30 CPU-seconds of imports each. The small modules that use them go with the shared servers'
# users, where `formats/test_real_readers.py` loads them anyway (the playbooks' modules keep their own
# process).
READER_USERS = ("tests/vocab/test_vocab_readers.py", "tests/collect/test_collect_readers.py",
                "tests/formats/test_arrow_dataset.py")

# The longest work first, longest to shortest, so that none starts late and ends the run alone on one
# process: the extract playbook's sandbox (about 12 process-minutes), the 16 modules that share the
# shared servers and the readers (about 12, together), the fleet (about 7); then every other module,
# in collection order (docs/testing.md has the minutes).
SHARED = "the modules that use the shared servers or the readers"
START_ORDER = ("tests/ansible/test_extract_playbook.py", SHARED, "tests/ansible/test_fleet.py")


def _scope_of(nodeid: str) -> str:
    """What a pytest process takes whole: the test's module, or `SHARED` for the shared servers' and
    the small reader modules' users."""
    module = _module_of(nodeid)
    return SHARED if _uses_session_servers(module) or module in READER_USERS else module


def _start_rank(item: pytest.Item) -> int:
    scope = _scope_of(item.nodeid)
    return START_ORDER.index(scope) if scope in START_ORDER else len(START_ORDER)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses a fixture whose name ends in ``_server`` starts or uses a real SGLang
    server: mark it `server`, so the fast tier leaves it out whatever marks its module forgot; and
    every test of a `SLOW_MODULES` module `slow`. The modules are then put in the order they start
    in (`_start_rank`; each keeps its own tests' order)."""
    items.sort(key=_start_rank)
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        if any(name.endswith("_server") for name in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)
        module = Path(str(item.fspath)).resolve()
        if module.is_relative_to(tests_dir) and str(module.relative_to(tests_dir)) in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`make test`'s pytest processes (``--dist loadfile``) take whole modules, as xdist's own
    loadfile does, so that a module keeps its fixtures, sandbox and ordered steps on one process;
    except that the modules that use the shared servers (and the small ones that load the trainers'
    readers) go to one process together, so that the suite starts each shared server and each
    reader once, not once per process."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the collection's order (`_start_rank`), not by test count

    class ModulesSharingServers(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope_of(nodeid)

    return ModulesSharingServers(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Wake the shared servers before a test of a module that uses them (and its fixtures) starts."""
    if _uses_session_servers(_module_of(item.nodeid)):
        for handle in _started:
            handle.resume()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After a test and the fixtures that end with it, pause the shared servers when the next test
    is of a module that does not use them. The session's last test (no next one) leaves them to
    their fixtures' stop."""
    result = yield
    if nextitem is not None and not _uses_session_servers(_module_of(nextitem.nodeid)):
        for handle in _started:
            handle.pause()
    return result


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The servers whose fixtures stopped them in the background (`ServerHandle.stop_later`) are gone
    before the session ends."""
    wait_stopped()


@pytest.fixture(scope="session")
def tiny_llama() -> Path:
    return _tiny_model("llama")


@pytest.fixture(scope="session")
def tiny_dsv3() -> Path:
    return _tiny_model("dsv3")


@pytest.fixture(scope="session")
def free_port():
    """Call it to get a free port of the suite's range."""
    return lambda: _free_port(*PORT_RANGE)


def _session_server(request, tmp_path_factory, model_dir: Path, name: str, **settings) -> ServerHandle:
    base = tmp_path_factory.mktemp(f"{name}-server")
    handle = start_server(
        model_dir,
        port=_free_port(*PORT_RANGE),
        dump_dir=base / "dump",
        log_dir=base / "logs",
        rid_prefix="hsx",
        capture_extra=SESSION_CAPTURE_EXTRA,
        **settings,
    )
    request.addfinalizer(handle.stop_later)
    _started.append(handle)
    return handle


@pytest.fixture(scope="session")
def llama_server(request, tmp_path_factory, tiny_llama) -> ServerHandle:
    return _session_server(request, tmp_path_factory, tiny_llama, "llama")


@pytest.fixture(scope="session")
def dsv3_server(request, tmp_path_factory, tiny_dsv3) -> ServerHandle:
    """The suite's DeepSeek-V3 (MLA + MoE) server, storing the final hidden state pre-norm, as the
    speculators formats need for Kimi-K2 and DeepSeek: its final norm is reached through SGLang's
    residual stream (a fused add + norm), not the plain call Llama makes, so it is the one final
    state whose capture differs by architecture. The post-norm state is the logits processor's
    input whatever the model, tested on `llama_server`. One server for both saves a start."""
    return _session_server(request, tmp_path_factory, tiny_dsv3, "dsv3", final_hidden="pre_norm")


@pytest.fixture(scope="session")
def llama_prenorm_server(request, tmp_path_factory, tiny_llama) -> ServerHandle:
    """The suite's second Llama server, whose settings differ from `llama_server`'s in every way the
    tests need and that do not bear on each other: the final hidden state pre-norm (the speculators
    formats), aux layers given in SGLang's convention, SGLang's start-up warmup on (it must not be
    dumped), and the capture writing from threads of the scheduler's process (writer_process off).
    One server for all of them saves three starts."""
    return _session_server(request, tmp_path_factory, tiny_llama, "llama-prenorm", final_hidden="pre_norm",
                           aux_layer_ids=PRENORM_SGLANG_LAYERS, layer_convention="sglang", skip_warmup=False,
                           writer_process=False)
