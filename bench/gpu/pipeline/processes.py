"""The product's processes as the units run them: `hsextract drain --exit-when-done` and one or more
`hsextract extract`, each a process of its own in the product's environment, started in the order a
`Case` asks for, with the timeline sampled beside them; what they report comes from `verdict`."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import gpu_env
from gpu_server import ServerHandle

from .case import Case
from .sampling import OutputReaper, Timeline
from .settings import FORMAT, SITE
from .verdict import summarize, tail


def product_env(env: gpu_env.GpuEnv) -> dict[str, str]:
    """The environment of `hsextract extract` and `hsextract drain`: the bundle's packages, no GPU."""
    run_env = env.server_env(())
    run_env["CUDA_VISIBLE_DEVICES"] = ""
    return run_env


def free_port() -> int:
    """A port free now on the loopback, for the drain's metrics endpoint."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drain_command(
    py: list[str],
    server: ServerHandle,
    model: Path,
    out: Path,
    selfcheck_share: float,
    metrics_port: int | None,
    fmt: str = FORMAT,
    precision: str = "bf16",
) -> list[str]:
    """`hsextract drain` as its unit runs it: the self-check asks the server for the checked prompts' logprobs."""
    metrics = [] if metrics_port is None else ["--metrics-port", str(metrics_port)]
    return [
        *py,
        "drain",
        "--dump-dir",
        str(server.dump_dir),
        "--output",
        str(out),
        "--format",
        fmt,
        "--precision",
        precision,
        "--model",
        str(model),
        "--exit-when-done",
        "--selfcheck-share",
        str(selfcheck_share),
        "--selfcheck-server",
        server.url,
        *metrics,
    ]


def client_command(py: list[str], server: ServerHandle, case: Case) -> list[str]:
    """`hsextract extract` for ``case`` (without ``--process``: each client adds its own)."""
    cmd = [
        *py,
        "extract",
        "--server",
        server.url,
        "--dataset",
        str(case.dataset),
        "--model",
        str(case.model),
        "--dump-dir",
        str(server.dump_dir),
        "--output",
        str(case.out),
        "--format",
        case.format,
        "--precision",
        case.precision,
        "--max-in-flight",
        str(case.in_flight),
        "--max-tokens",
        str(case.max_tokens),
        "--log-every",
        "5",
    ]
    if case.drain_after:
        cmd += ["--max-staged", "0"]
    return cmd


def py_spy(out: Path, *flags: str) -> list[str]:
    """The prefix that runs a command under py-spy, sampling without pausing it, into ``out`` (raw)."""
    return [str(SITE / "bin" / "py-spy"), "record", *flags, "-f", "raw", "-o", str(out), "--"]


def run_case(env: gpu_env.GpuEnv, server: ServerHandle, case: Case) -> dict:
    """The drain and the client (``case.processes`` of them), started together as separate processes
    unless the case says otherwise (`Case`); what they report, with a timeline of both."""
    shutil.rmtree(case.out, ignore_errors=True)
    logs = case.out.parent / f"{case.out.name}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "hsextract"]
    metrics_port = free_port()
    drain_cmd = drain_command(
        py, server, case.model, case.out, case.selfcheck_share, metrics_port, case.format, case.precision
    )
    if case.profile_drain is not None:
        drain_cmd = [
            *py_spy(case.profile_drain, "-r", "50", "--nonblocking", "--subprocesses", "--threads"),
            *drain_cmd,
        ]
    client_cmd = client_command(py, server, case)
    run_env = product_env(env)
    drain_up_s = None
    with contextlib.ExitStack() as stack:
        dlog = stack.enter_context(open(logs / "drain.log", "wb"))
        drain = None
        if case.drain_first:
            started = time.monotonic()
            drain = subprocess.Popen(drain_cmd, stdout=dlog, stderr=subprocess.STDOUT, env=run_env)
            wait_drain_up(drain, logs / "drain.log", metrics_port)
            drain_up_s = round(time.monotonic() - started, 2)
        t0 = time.monotonic()
        timeline = stack.enter_context(Timeline(server.dump_dir, metrics_port, t0))
        reaper = stack.enter_context(OutputReaper(case.out)) if case.reap else None
        if not case.drain_after and drain is None:
            drain = subprocess.Popen(drain_cmd, stdout=dlog, stderr=subprocess.STDOUT, env=run_env)
        clients = start_clients(case, client_cmd, logs, run_env)
        first_request = wait_first_record(server.dump_dir, clients[0], t0)
        client_rcs = [c.wait(timeout=1800) for c in clients]
        client_done = time.monotonic()
        if drain is None:
            drain = subprocess.Popen(drain_cmd, stdout=dlog, stderr=subprocess.STDOUT, env=run_env)
        drain_rc = drain.wait(timeout=1800)
    wall = time.monotonic() - t0
    client_rc = next((rc for rc in client_rcs if rc), 0)
    res = summarize(case.out, logs, client_rc, drain_rc, wall, client_done - t0, first_request)
    res["timeline"] = timeline.summary(client_done - t0)
    res["tail_s"] = round(wall - (client_done - t0), 2)
    if drain_up_s is not None:
        res["drain_up_before_client_s"] = drain_up_s
    if reaper is not None:
        res["reaped"] = {"files": reaper.files, "gb": round(reaper.bytes / 1e9, 3)}
    if case.drain_after:  # the drain's own pace over what the client staged (its start-up included)
        drain_s = wall - (client_done - t0)
        res["drain_alone_s"] = round(drain_s, 2)
        res["drain_alone_samples_per_s"] = round(res["samples"] / drain_s, 1) if drain_s > 0 else None
    return res


def start_clients(case: Case, client_cmd: list[str], logs: Path, run_env: dict[str, str]) -> list[subprocess.Popen]:
    """``case.processes`` clients, each on its sub-shard (`--process j/P`), the first under py-spy
    where the case profiles it."""
    clients = []
    for j in range(case.processes):
        extra = ["--process", f"{j}/{case.processes}"] if case.processes > 1 else []
        # Only the thread holding the GIL, without pausing the client (a blocking py-spy slowed it 6 times).
        spy = (
            []
            if case.profile is None or j
            else py_spy(case.profile, "-r", "100", "--nonblocking", "--gil", "--threads")
        )
        with open(logs / f"client{j or ''}.log", "wb") as clog:
            clients.append(
                subprocess.Popen([*spy, *client_cmd, *extra], stdout=clog, stderr=subprocess.STDOUT, env=run_env)
            )
    return clients


def wait_drain_up(drain: subprocess.Popen, log_path: Path, metrics_port: int, timeout_s: float = 300) -> None:
    """Until the drain answers on its metrics port and, when its workers are processes, has logged
    them started: the state its unit is in long before a client's first request."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if drain.poll() is not None:
            raise RuntimeError(f"the drain exited ({drain.returncode}) before it was up: {tail(log_path)}")
        text = log_path.read_text(errors="replace")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=1).close()
            answering = True
        except OSError:
            answering = False
        if answering and ("workers in threads" in text or "worker processes started" in text):
            return
        time.sleep(0.1)
    drain.kill()
    raise RuntimeError(f"the drain was not up in {timeout_s:.0f} s: {tail(log_path)}")


def wait_first_record(dump_dir: Path, client: subprocess.Popen, t0: float) -> float | None:
    """Seconds from the start until the client wrote its first sample's record (just before it sends it)."""
    records = Path(dump_dir) / "_records"
    since = time.time() - (time.monotonic() - t0)  # an earlier run's records on the same server are not this one's
    while client.poll() is None:
        try:
            if any(True for p in os.scandir(records) if "-p" not in p.name and p.stat().st_mtime >= since):
                return round(time.monotonic() - t0, 2)
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    return None
