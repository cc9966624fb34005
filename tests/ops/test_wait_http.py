"""`python -m hsextract.ops.wait_http` (the server unit's ExecStartPost) waits for a 200, or gives up early."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "files" / "python")}


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def wait_http(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hsextract.ops.wait_http", *args], env=ENV, capture_output=True, text=True, timeout=60
    )


def test_a_healthy_url_returns_at_once():
    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = wait_http(f"http://127.0.0.1:{server.server_port}/health", "--timeout", "10")
    finally:
        server.shutdown()
    assert r.returncode == 0 and "is healthy" in r.stdout


def test_it_gives_up_as_soon_as_the_server_process_is_gone():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    start = time.monotonic()
    r = wait_http("http://127.0.0.1:9/health", "--timeout", "50", "--interval", "0.1", "--pid", str(gone.pid))
    assert r.returncode == 1 and "the server process exited" in r.stderr
    assert time.monotonic() - start < 20


def test_it_times_out_with_a_message():
    r = wait_http("http://127.0.0.1:9/health", "--timeout", "0.5", "--interval", "0.1")
    assert r.returncode == 1 and "no 200 within" in r.stderr
