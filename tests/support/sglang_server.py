"""Start and stop a real SGLang 0.5.23 server on CPU with the hidden-state capture switched on.

Used by the session fixtures in ``tests/conftest.py`` and by tests that must start their own
server (bad configurations, killing a server). The server runs from the test interpreter
(``sys.executable -m sglang.launch_server``) with the CPU ``sgl_kernel`` stub, the rendered
capture patch and the project's package on PYTHONPATH, in its own process group so that
``stop()`` can take the scheduler and detokenizer subprocesses down with it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests
from hsextract.capture.config import WRITER_PROCESS_DEFAULT, CaptureConfig
from hsextract.capture.patch import DEFAULT_PACKAGE, render_patch, server_launch
from hsextract.model_info import read_model_info

from support.tiers import refuse_in_fast_tier

REPO = Path(__file__).resolve().parents[2]
STUB_DIR = REPO / "tests" / "stubs"
PACKAGE_DIR = REPO / "files" / "python"
# The suite's pre-norm server's aux layers, in SGLang's convention (eagle ids 0, 2, 5 of the tiny
# 8-layer model): tests/conftest.py starts it, the readers' tests drain its dumps.
PRENORM_SGLANG_LAYERS = [1, 3, 6]
STARTUP_TIMEOUT_S = float(os.environ.get("HSEXTRACT_SERVER_STARTUP_TIMEOUT", "420"))


class ServerStartError(RuntimeError):
    """The server did not become healthy; the message carries the tail of its log."""


def log_tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# Ports handed out by this process, each held by an flock so that several pytest processes that
# share a port range (the suites of several packages use these fixtures) never pick the same one.
_PORT_LOCK_DIR = Path(tempfile.gettempdir()) / "hsextract-test-ports"
_port_locks: dict[int, int] = {}


def free_port(lo: int, hi: int) -> int:
    """A free TCP port in [lo, hi], reserved for this process until `release_port`."""
    _PORT_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    for port in range(lo, hi + 1):
        if port in _port_locks:
            continue
        fd = os.open(_PORT_LOCK_DIR / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        if port_is_free(port):
            _port_locks[port] = fd
            return port
        os.close(fd)
    raise RuntimeError(f"no free port in {lo}-{hi}")


def release_port(port: int) -> None:
    fd = _port_locks.pop(port, None)
    if fd is not None:
        os.close(fd)


def listening_pids(port: int) -> set[int]:
    """Pids of the processes that listen on `port` (needs the rights to see them; root in tests)."""
    pids = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            pids.add(conn.pid)
    return pids


def process_tree(pid: int) -> set[int]:
    try:
        root = psutil.Process(pid)
        return {pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


@dataclass
class ServerHandle:
    url: str
    port: int
    dump_dir: Path
    model_dir: Path
    rid_prefix: str
    proc: subprocess.Popen
    log_path: Path
    patch_dir: Path | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def pause(self) -> None:
        """Freeze the whole process group (SIGSTOP) while no test needs the server: an idle CPU
        server still burns about 1 CPU-second a minute (the 10 ms polls of torch's gloo threads)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server run again (SIGCONT); nothing happens to a running one."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self, timeout: float = 20) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after `timeout` seconds."""
        self.resume()  # a paused server handles its SIGTERM only once it runs again
        if self.proc.poll() is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            release_port(self.port)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        # Children that outlived the leader (scheduler, detokenizer) share its process group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        release_port(self.port)

    def stop_later(self) -> None:
        """`stop` in a thread of its own: SIGTERM now, the rest while the next tests run. SGLang takes
        about 5 s to shut down (its shutdown sleeps; nothing for the CPU to do), a fixture's teardown
        need not wait for it. The port stays reserved until the server is gone; `wait_stopped` (the
        session's end) waits for every such stop."""
        thread = threading.Thread(target=self.stop, name=f"stop-server-{self.port}", daemon=True)
        thread.start()
        _stopping.append(thread)

    def generate(
        self, input_ids: Sequence[int], rid: str | None = None, max_new_tokens: int = 1, timeout: float = 120
    ) -> dict:
        """POST /generate at temperature 0; returns the response JSON."""
        body: dict = {
            "input_ids": list(input_ids),
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
        }
        if rid is not None:
            body["rid"] = rid
        r = requests.post(f"{self.url}/generate", json=body, timeout=timeout)
        r.raise_for_status()
        return r.json()


# Servers being stopped by `ServerHandle.stop_later`.
_stopping: list[threading.Thread] = []


def wait_stopped(timeout: float = 60) -> None:
    """Wait for every server stopped with `stop_later` to be gone (each stop ends in SIGKILL)."""
    deadline = time.monotonic() + timeout
    while _stopping:
        _stopping.pop().join(max(0.0, deadline - time.monotonic()))


def start_server(
    model_dir: str | Path,
    *,
    port: int,
    dump_dir: str | Path,
    log_dir: str | Path,
    rid_prefix: str = "hsx",
    aux_layer_ids: Sequence[int] | None = None,
    layer_convention: str = "eagle",
    final_hidden: str = "post_norm",
    chunked_prefill_size: int = 16,
    max_total_tokens: int = 4096,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    capture: bool = True,
    architecture: str | None = None,
    wait: bool = True,
    skip_warmup: bool = True,
    startup_timeout: float = STARTUP_TIMEOUT_S,
    capture_extra: dict[str, int] | None = None,
    check_layers: bool = True,
    radix_cache: bool = False,
    writer_process: bool = WRITER_PROCESS_DEFAULT,
    precision: str = "bf16",
) -> ServerHandle:
    """Start ``sglang.launch_server`` on CPU and wait for /health (unless ``wait=False``).

    ``radix_cache=True`` (only without the capture) serves as a generation server does: the
    prefix cache on, as regeneration wants it.
    On failure the process group is stopped and `ServerStartError` carries the log's tail.
    """
    refuse_in_fast_tier("a SGLang server", "server")
    if radix_cache and capture:
        raise ValueError("the capture needs the radix cache off; radix_cache=True needs capture=False")
    model_dir = Path(model_dir)
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    dump_dir = Path(dump_dir)
    patch_dir = None
    pythonpath = [str(STUB_DIR), str(PACKAGE_DIR)]
    run_env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_EXTERNAL_MODEL_PACKAGE",)}
    args = ["--disable-radix-cache", "--skip-server-warmup", "--sleep-on-idle"]
    if capture:
        capture_config = CaptureConfig(
            architecture=architecture or read_model_info(model_dir).architecture,
            model_path=str(model_dir),
            aux_layer_ids=None if aux_layer_ids is None else list(aux_layer_ids),
            layer_convention=layer_convention,
            dump_dir=str(dump_dir),
            rid_prefix=rid_prefix,
            final_hidden=final_hidden,
            extra=dict(capture_extra or {}),
            writer_process=writer_process,
            precision=precision,
        )
        patch_dir = render_patch(log_dir / f"patch-{port}", capture_config, check_layers=check_layers)
        launch = server_launch(patch_dir, package_name=DEFAULT_PACKAGE, device="cpu", pythonpath=pythonpath)
        run_env.update(launch.env)
        args = launch.args
    else:
        run_env.update({"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": os.pathsep.join(pythonpath)})
        args += ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph"]
        if radix_cache:
            args.remove("--disable-radix-cache")
    if not skip_warmup:
        args = [a for a in args if a != "--skip-server-warmup"]
    run_env.setdefault("OMP_NUM_THREADS", "1")
    run_env.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_env.update(env or {})
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-total-tokens",
        str(max_total_tokens),
        "--chunked-prefill-size",
        str(chunked_prefill_size),
        "--log-level",
        "info",
        *args,
        *extra_args,
    ]
    log_path = log_dir / f"server-{port}.log"
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, env=run_env, cwd=str(log_dir), start_new_session=True
        )
    handle = ServerHandle(f"http://127.0.0.1:{port}", port, dump_dir, model_dir, rid_prefix, proc, log_path, patch_dir)
    if wait:
        try:
            wait_healthy(handle, startup_timeout)
        except BaseException:
            handle.stop()
            raise
    return handle


def wait_healthy(handle: ServerHandle, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if handle.proc.poll() is not None:
            raise ServerStartError(
                f"SGLang server on port {handle.port} exited with code {handle.proc.returncode} during startup; "
                f"log {handle.log_path}:\n{log_tail(handle.log_path)}"
            )
        try:
            healthy = requests.get(f"{handle.url}/health", timeout=5).status_code == 200
        except requests.RequestException:
            healthy = False
        if healthy:
            owners = listening_pids(handle.port)
            if owners & process_tree(handle.proc.pid):
                return
            raise ServerStartError(
                f"port {handle.port} answers /health, but it is held by another process ({sorted(owners)}), "
                f"not by the server this test started; log {handle.log_path}:\n{log_tail(handle.log_path)}"
            )
        time.sleep(0.25)  # a poll of /health costs nothing next to the start it waits for
    raise ServerStartError(
        f"SGLang server on port {handle.port} not healthy after {timeout:.0f} s; "
        f"log {handle.log_path}:\n{log_tail(handle.log_path)}"
    )


def wait_exit(handle: ServerHandle, timeout: float) -> int | None:
    """Wait for a server expected to fail at startup; its exit code, or None if still running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if handle.proc.poll() is not None:
            return handle.proc.returncode
        time.sleep(0.5)
    return None
