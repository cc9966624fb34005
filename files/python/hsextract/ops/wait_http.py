"""Wait until a URL answers 200: ``python -m hsextract.ops.wait_http URL [--timeout S] [--pid PID]``.

The server unit runs it as ``ExecStartPost=``, so systemd counts the server as started only once
SGLang answers ``/health`` (a 1T-parameter model loads for ~12 minutes): units ordered after it
then really start after the server is ready, and ``TimeoutStartSec=`` bounds the load. With
``--pid`` it gives up at once when that process (the server) exits, instead of waiting out the
timeout. Exit 0 when healthy, 1 on timeout or when the server died. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request

from hsextract.units import duration


def healthy(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def alive(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait(url: str, timeout: float, interval: float = 2.0, pid: int | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if healthy(url):
            return True
        if not alive(pid):
            return False
        time.sleep(interval)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hsextract.ops.wait_http", description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds (default 1200)")
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--pid", type=int, help="stop waiting when this process exits")
    args = parser.parse_args(argv)
    if wait(args.url, args.timeout, args.interval, args.pid):
        print(f"{args.url} is healthy")
        return 0
    why = "the server process exited" if not alive(args.pid) else f"no 200 within {duration(args.timeout)}"
    print(f"{args.url} did not become healthy: {why}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
