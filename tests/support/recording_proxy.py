"""An HTTP proxy in front of a real server that keeps a copy of every chat completion request and answer.

Tests use it to see the requests the regenerator actually sent (the history of each turn), not
what it meant to send; everything is forwarded unchanged to the server behind it, but for the
paths it is told to hide, which answer 404 as a front end that does not expose them does.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import aiohttp
from aiohttp import web


class RecordingProxy:
    def __init__(self, target: str, port: int, hidden: tuple[str, ...] = ()):
        self.target = target.rstrip("/")
        self.hidden = hidden
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.exchanges: list[tuple[dict[str, Any], int, Any]] = []  # (request body, status, answer)
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="recording-proxy", daemon=True)
        self._runner: web.AppRunner | None = None

    def requests(self) -> list[dict[str, Any]]:
        """The bodies of the requests the server answered (a refused one, e.g. too long for the context, is
        sent again by the client with fewer new tokens: see `exchanges` for every one)."""
        with self._lock:
            return [body for body, status, _ in self.exchanges if status == 200]

    def clear(self) -> None:
        with self._lock:
            self.exchanges.clear()

    async def _forward(self, request: web.Request) -> web.Response:
        if request.path in self.hidden:
            return web.Response(status=404, text="not found")
        body = await request.read()
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session,
            session.request(
                request.method,
                self.target + request.rel_url.path_qs,
                data=body,
                headers={"Content-Type": request.headers.get("Content-Type", "application/json")},
            ) as resp,
        ):
            answer = await resp.read()
            if request.path == "/v1/chat/completions":
                try:
                    parsed = json.loads(answer)
                except ValueError:
                    parsed = answer.decode(errors="replace")
                with self._lock:
                    self.exchanges.append((json.loads(body), resp.status, parsed))
            return web.Response(body=answer, status=resp.status, content_type=resp.content_type)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=1 << 28)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    def start(self) -> RecordingProxy:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the recording proxy did not start")
        return self

    def stop(self) -> None:
        """Stop listening (requests in flight are answered first); idempotent."""
        if not self._thread.is_alive():
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(120)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
