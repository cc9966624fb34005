"""An HTTP server on loopback in a thread of its own, in front of a real server: what the tests'
proxies share (support.recording_proxy keeps a copy of the chat completions it forwards,
support.faulty_store misbehaves on purpose in front of an S3 server).

A subclass says what becomes of each request (`handle`); `forward` sends one on to the server
behind, unchanged but for the hop-by-hop headers, and returns the server's answer whole.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

# Headers of one connection, not of the request: never forwarded. ``Expect`` is answered by this
# server itself (aiohttp's own 100-continue) and is not signed by S3 clients.
HOP_BY_HOP = frozenset(
    ("connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection", "expect", "content-length")
)


@dataclass
class Answer:
    """The server's answer to a forwarded request, read whole."""

    status: int
    headers: CIMultiDict[str]
    body: bytes
    length: int  # the Content-Length the server gave (a HEAD's is its object's size, with no body)


class ProxyServer:
    """Listens on 127.0.0.1:`port` and hands every request to `handle` (see the module docstring)."""

    def __init__(self, target: str, port: int, name: str = "proxy"):
        self.target = target.rstrip("/")
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._name = name
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def forward(self, request: web.Request, body: bytes, headers: dict[str, str] | None = None) -> Answer:
        """Send the request on to the target with `body`: its own headers (``Host`` included, which
        a signed request needs), or `headers`; the answer, its body undecoded."""
        assert self._session is not None
        sent = headers if headers is not None else forwarded_headers(request.headers)
        async with self._session.request(
            request.method,
            self.target + request.rel_url.raw_path_qs,
            data=body,
            headers=sent,
            allow_redirects=False,
            skip_auto_headers=("Content-Type", "User-Agent", "Accept", "Accept-Encoding"),
        ) as resp:
            data = await resp.read()
            length = int(resp.headers.get("Content-Length", len(data)))
            kept = CIMultiDict((k, v) for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP)
            return Answer(resp.status, kept, data, length)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._session = self._loop.run_until_complete(_session())
        self._ready.set()
        self._loop.run_forever()

    def start(self):
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"the {self._name} did not start")
        return self

    def stop(self) -> None:
        """Stop listening (requests in flight are answered first); idempotent."""
        if not self._thread.is_alive():
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(120)
        if self._session is not None:
            asyncio.run_coroutine_threadsafe(self._session.close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


async def _session() -> aiohttp.ClientSession:
    # A connection of its own for each request: a kept-alive one the server closed while idle would
    # fail a request the proxy was not told to fail.
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True, limit=0),
        timeout=aiohttp.ClientTimeout(total=600),
        auto_decompress=False,
    )


def forwarded_headers(headers) -> dict[str, str]:
    """The request's headers less the hop-by-hop ones."""
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}
