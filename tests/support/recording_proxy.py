"""An HTTP proxy in front of a real server that keeps a copy of every request and answer of the
paths it records (chat completions by default).

Tests use it to see the requests a command actually sent (the regenerator's history of each turn,
the drain's self-check asks), not what it meant to send, and what was in flight at an instant;
everything is forwarded unchanged to the server behind it, but for the paths it is told to hide,
which answer 404 as a front end that does not expose them does.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from aiohttp import web

from support.http_proxy import ProxyServer


class RecordingProxy(ProxyServer):
    def __init__(
        self,
        target: str,
        port: int,
        hidden: tuple[str, ...] = (),
        recorded: tuple[str, ...] = ("/v1/chat/completions",),
    ):
        super().__init__(target, port, "recording-proxy")
        self.hidden = hidden
        self.recorded = recorded
        self.exchanges: list[tuple[dict[str, Any], int, Any]] = []  # (request body, status, answer)
        self.in_flight = 0  # requests of the recorded paths forwarded and not yet answered
        self._lock = threading.Lock()

    def requests(self) -> list[dict[str, Any]]:
        """The bodies of the requests the server answered (a refused one, e.g. too long for the context, is
        sent again by the client with fewer new tokens: see `exchanges` for every one)."""
        with self._lock:
            return [body for body, status, _ in self.exchanges if status == 200]

    def clear(self) -> None:
        with self._lock:
            self.exchanges.clear()

    async def handle(self, request: web.Request) -> web.Response:
        if request.path in self.hidden:
            return web.Response(status=404, text="not found")
        body = await request.read()
        recorded = request.path in self.recorded
        with self._lock:
            self.in_flight += recorded
        try:
            answer = await self.forward(
                request, body, {"Content-Type": request.headers.get("Content-Type", "application/json")}
            )
        finally:
            with self._lock:
                self.in_flight -= recorded
        if recorded:
            try:
                parsed = json.loads(answer.body)
            except ValueError:
                parsed = answer.body.decode(errors="replace")
            with self._lock:
                self.exchanges.append((json.loads(body), answer.status, parsed))
        content_type = answer.headers.get("Content-Type", "application/octet-stream").split(";")[0].strip()
        return web.Response(body=answer.body, status=answer.status, content_type=content_type)
