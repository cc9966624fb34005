"""A store that misbehaves on purpose: a proxy between hsextract and a real S3 server (support.s3_server)
that injects the faults a network and a loaded server make.

Every request is forwarded unchanged (its ``Host`` header too, which its signature covers) unless a
fault hits it:

=====================  ==========================================================================
``reset_upload``       the connection is reset after half of the request's body was read (a GET's
                       at once): the server never sees the request
``reset_download``     the server's answer is sent up to half of its body, then the connection is
                       reset (an answer without a body: reset before it, as ``answer_lost``)
``truncated``          the same, but the connection is closed in order (FIN): a body shorter than
                       its ``Content-Length``
``status_500``         ``500 InternalError``, never forwarded
``status_503``         ``503 SlowDown``, never forwarded
``slow``               forwarded (the server applies it), answered after `slow_s`, past the
                       client's read timeout
``answer_lost``        forwarded (the server applies it), then the connection is reset without an
                       answer: a PUT applied whose answer was lost
=====================  ==========================================================================

A fault is injected on its own (`inject`: by method, a pattern of the request's path and query, a
count) or as a seeded random mix over every request (`mix`). `fired` counts what was injected,
by fault and method, so a test can say that a fault happened and what the client made of it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass

from aiohttp import web

from support.http_proxy import Answer, ProxyServer

RESET_UPLOAD = "reset_upload"
RESET_DOWNLOAD = "reset_download"
TRUNCATED = "truncated"
STATUS_500 = "status_500"
STATUS_503 = "status_503"
SLOW = "slow"
ANSWER_LOST = "answer_lost"
KINDS = (RESET_UPLOAD, RESET_DOWNLOAD, TRUNCATED, STATUS_500, STATUS_503, SLOW, ANSWER_LOST)

# A slow answer comes this long after the request; a client under test waits CLIENT_TIMEOUT_S for
# one (``--s3-timeout``), so every slow answer is one it gave up on.
SLOW_S = 2.5
CLIENT_TIMEOUT_S = 1.0
# The proxy's faults pass at once, as a loaded server's hiccups do: a client under test asks again
# after 0.05 s (``--s3-first-wait``), doubling, instead of a remote server's 0.5 s.
FIRST_WAIT_S = 0.05

_ERRORS = {STATUS_500: (500, "InternalError"), STATUS_503: (503, "SlowDown")}


class _QuietResets(logging.Filter):
    """aiohttp logs a traceback for each answer it could not write to a connection a fault reset."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, ConnectionError)


logging.getLogger("aiohttp.server").addFilter(_QuietResets())


@dataclass
class Rule:
    """One fault for the requests that match: `method` ("*": any) and `key`, a regular expression
    searched in ``<path>?<query>`` (the path is ``/<bucket>/<key>``); it hits `count` of them."""

    kind: str
    method: str = "*"
    key: str = ""
    count: float = 1
    hits: int = 0

    def matches(self, method: str, target: str) -> bool:
        return (
            self.hits < self.count
            and self.method in ("*", method)
            and (not self.key or re.search(self.key, target) is not None)
        )


@dataclass
class Mix:
    """Each request that matches `key` meets one of `kinds` with probability `rate`, drawn from
    one seeded generator."""

    rng: random.Random
    rate: float
    kinds: tuple[str, ...] = KINDS
    key: str = ""

    def draw(self, target: str) -> str:
        """The fault for a request of `target`, or ""."""
        if (self.key and re.search(self.key, target) is None) or self.rng.random() >= self.rate:
            return ""
        return self.rng.choice(self.kinds)


class FaultyStore(ProxyServer):
    """The proxy (see the module docstring); its `url` is the endpoint to give hsextract."""

    def __init__(self, target: str, port: int, slow_s: float = SLOW_S):
        super().__init__(target, port, "faulty-store")
        self.slow_s = slow_s
        self.rules: list[Rule] = []
        self._mix: Mix | None = None
        self._lock = threading.Lock()
        self.fired: Counter[tuple[str, str]] = Counter()  # (fault, method) -> requests it hit
        self.hits: list[tuple[str, str, str]] = []  # (fault, method, path?query) of each, in order
        self.requests: Counter[str] = Counter()  # method -> requests seen

    def inject(self, kind: str, *, method: str = "*", key: str = "", count: float = 1) -> Rule:
        """A fault for the next `count` requests that match (math.inf: every one)."""
        if kind not in KINDS:
            raise ValueError(f"unknown fault {kind!r}: one of {', '.join(KINDS)}")
        rule = Rule(kind, method, key, count)
        with self._lock:
            self.rules.append(rule)
        return rule

    def mix(self, seed: int, rate: float, kinds: tuple[str, ...] = KINDS, key: str = "") -> None:
        """A random mix of `kinds` over every request from now on (rules injected still come first)."""
        with self._lock:
            self._mix = Mix(random.Random(seed), rate, kinds, key)

    def calm(self) -> None:
        """No more faults: the rules and the mix are dropped (what was fired stays counted)."""
        with self._lock:
            self.rules.clear()
            self._mix = None

    def fired_of(self, kind: str, method: str = "*") -> int:
        with self._lock:
            return sum(n for (k, m), n in self.fired.items() if k == kind and method in ("*", m))

    def _choose(self, method: str, target: str) -> str:
        with self._lock:
            self.requests[method] += 1
            kind = ""
            for rule in self.rules:
                if rule.matches(method, target):
                    rule.hits += 1
                    kind = rule.kind
                    break
            if not kind and self._mix is not None:
                kind = self._mix.draw(target)
            if kind:
                self.fired[(kind, method)] += 1
                self.hits.append((kind, method, target))
            return kind

    async def handle(self, request: web.Request) -> web.StreamResponse:
        target = request.path + ("?" + request.query_string if request.query_string else "")
        kind = self._choose(request.method, target)
        if kind == RESET_UPLOAD:
            length = request.content_length or 0
            if length > 1:
                await request.content.readexactly(length // 2)
            return _reset(request)
        body = await request.read()
        if kind in _ERRORS:
            status, code = _ERRORS[kind]
            return _error(status, code)
        answer = await self.forward(request, body)
        if kind == ANSWER_LOST:
            return _reset(request)
        if kind == SLOW:
            await asyncio.sleep(self.slow_s)
        if kind in (RESET_DOWNLOAD, TRUNCATED):
            return await _cut(request, answer, reset=kind == RESET_DOWNLOAD)
        return await _send(request, answer)


def _reset(request: web.Request) -> web.Response:
    """Reset the client's connection (RST, not FIN); what is returned is never sent."""
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    return web.Response(status=599)


def _error(status: int, code: str) -> web.Response:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>injected by the test's faulty store</Message>"
        "<RequestId>faulty-store</RequestId></Error>"
    )
    return web.Response(status=status, body=body.encode(), content_type="application/xml")


async def _send(request: web.Request, answer: Answer) -> web.StreamResponse:
    resp = web.StreamResponse(status=answer.status, headers=answer.headers)
    resp.content_length = answer.length
    await resp.prepare(request)
    if answer.body and request.method != "HEAD":
        await resp.write(answer.body)
    await resp.write_eof()
    return resp


async def _cut(request: web.Request, answer: Answer, reset: bool) -> web.StreamResponse:
    """Half of the answer's body under its whole length, then the connection ends; an answer with
    no body to cut is lost whole."""
    if not answer.body or request.method == "HEAD":
        return _reset(request)
    resp = web.StreamResponse(status=answer.status, headers=answer.headers)
    resp.content_length = answer.length
    await resp.prepare(request)
    await resp.write(answer.body[: max(1, len(answer.body) // 2)])
    if reset:
        return _reset(request)
    assert request.transport is not None
    request.transport.close()
    return resp
