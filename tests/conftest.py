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

import hashlib
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "files" / "python", REPO / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from support import scheduling  # noqa: E402
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


def _tiny_model(kind: str, seed: int = 0) -> Path:
    from hsextract import tiny_model

    digest = hashlib.sha256(Path(tiny_model.__file__).read_bytes()).hexdigest()[:12]
    path = _models_root() / (f"{kind}-{digest}" if seed == 0 else f"{kind}-seed{seed}-{digest}")
    lock = path.with_name(path.name + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    import fcntl

    with open(lock, "w") as fh:  # several pytest processes may build the same model at once
        fcntl.flock(fh, fcntl.LOCK_EX)
        tiny_model.ensure_tiny_model(kind, path, seed)
    return path


# The session's shared servers (below). Each pytest process of `make test` that runs a test using
# one starts its own: about 35 CPU-seconds of start, and 1 CPU-second a minute while it idles.
# The shared servers this process started: paused (`ServerHandle.pause`) while its tests are
# elsewhere, and after the last of them.
_started: list[ServerHandle] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses a fixture whose name ends in ``_server`` starts or uses a real SGLang
    server: mark it `server`, so the fast tier leaves it out whatever marks its module forgot. The
    modules are then put in the order they start in (`scheduling.start_rank`; each keeps its own
    tests' order). A module whose tests start processes says so itself: ``pytestmark`` with
    `pytest.mark.slow`."""
    items.sort(key=scheduling.start_rank)
    for item in items:
        if any(name.endswith("_server") for name in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`make test`'s pytest processes take whole modules, the shared servers' users together
    (`support.scheduling`)."""
    return scheduling.make_scheduler(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Wake the shared servers before a test of a module that uses them (and its fixtures) starts."""
    if scheduling.uses_session_servers(scheduling.module_of(item.nodeid)):
        for handle in _started:
            handle.resume()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After a test and the fixtures that end with it, pause the shared servers when the next test
    is of a module that does not use them. The session's last test (no next one) leaves them to
    their fixtures' stop."""
    result = yield
    if nextitem is not None and not scheduling.uses_session_servers(scheduling.module_of(nextitem.nodeid)):
        for handle in _started:
            handle.pause()
    return result


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The servers whose fixtures stopped them in the background (`ServerHandle.stop_later`) are gone
    before the session ends."""
    wait_stopped()


@pytest.fixture(scope="session")
def readers() -> Path:
    """The trainers' readers' environment (requirements/readers.txt), where reader tests load sets."""
    root = os.environ.get("HSEXTRACT_READERS")
    if not root:
        pytest.skip("HSEXTRACT_READERS is not set: install requirements/readers.txt (make venv) to run reader tests")
    return Path(root)


@pytest.fixture(scope="session")
def tiny_llama() -> Path:
    return _tiny_model("llama")


@pytest.fixture(scope="session")
def tiny_llama_seed2() -> Path:
    """The tiny Llama's twin: the same config.json, tokenizer and chat template, other weights."""
    return _tiny_model("llama", seed=2)


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
    return _session_server(
        request,
        tmp_path_factory,
        tiny_llama,
        "llama-prenorm",
        final_hidden="pre_norm",
        aux_layer_ids=PRENORM_SGLANG_LAYERS,
        layer_convention="sglang",
        skip_warmup=False,
        writer_process=False,
    )


@pytest.fixture(scope="session")
def llama_fp8_server(request, tmp_path_factory, tiny_llama) -> ServerHandle:
    """`llama_prenorm_server`'s model, final placement and layers, with the capture staging FP8 rows
    (its ``precision: fp8``: quantized before the copy to the host) and writing from its writer
    process (the default): the same prompts through both give the two stagings of one FP8 set."""
    return _session_server(
        request,
        tmp_path_factory,
        tiny_llama,
        "llama-fp8",
        final_hidden="pre_norm",
        aux_layer_ids=PRENORM_SGLANG_LAYERS,
        layer_convention="sglang",
        precision="fp8",
    )
