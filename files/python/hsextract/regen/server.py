"""Ask an SGLang server for one reply over its OpenAI-compatible ``/v1/chat/completions``.

The server's own chat template, reasoning parser and tool-call parser apply, so the replies are
exactly what the model is served as. A regeneration runs for days against servers that systemd
may restart, so a refused connection is not the conversation's fault: the client waits for the
server's ``/health`` (one poller per server) and asks again; only errors while the server is up
use up a turn's attempts. A server that stays down past ``server_wait_s`` is given up
(`ServerGone`); the runner hands its conversations to the other servers.

The requests never carry a request id: SGLang then gives each one a bare 32-hex uuid, which can
never match the ``<prefix>-<run id>-<index>`` ids the capture writes, so a regeneration run
against a server with the capture on never leaves a dump behind.

A history that leaves less room than ``max_tokens`` in the context is answered by SGLang with a
400 naming the prompt's length; the request is sent again with the room that is left, and a
history that fills the context is `TurnFailed` (``context_full``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import aiohttp

from hsextract.dataset.conversation import BadConversation, Message, parse_tool_call
from hsextract.errors import HsextractError
from hsextract.regen.core import CONTEXT_FULL, RETRIES_EXHAUSTED, SERVER_REJECTED, Reply, TurnFailed
from hsextract.regen.sampling import Sampling
from hsextract.retry import RetryPolicy
from hsextract.units import duration

log = logging.getLogger("hsextract.regen")

_CONTEXT_RE = re.compile(r"maximum context length of (\d+) tokens.*?(\d+) tokens from the input", re.DOTALL)
_INPUT_TOO_LONG_RE = re.compile(r"The input \((\d+) tokens\) is longer than the model's context length")


class ServerGone(HsextractError):
    """A server did not answer /health within the configured wait."""

    exit_code = 75  # EX_TEMPFAIL: systemd may restart the regenerator once the servers are back


def parse_reply(data: Any) -> Reply:
    """The first choice of a chat completion as a Reply; ValueError when the answer has no such shape."""
    try:
        choice = data["choices"][0]
        msg = choice["message"]
        calls = tuple(parse_tool_call(c, f"tool_calls[{i}]") for i, c in enumerate(msg.get("tool_calls") or ()))
        usage = data.get("usage") or {}
        reasoning = msg.get("reasoning_content")
        return Reply(
            Message("assistant", msg.get("content") or "", reasoning if isinstance(reasoning, str) else None, calls),
            str(choice.get("finish_reason") or ""),
            int(usage.get("completion_tokens") or 0),
            int(usage.get("prompt_tokens") or 0),
        )
    except (KeyError, IndexError, TypeError, AttributeError, BadConversation) as exc:
        raise ValueError(f"not a chat completion ({type(exc).__name__}: {str(exc)[:200]})") from exc


def room_left(status: int, text: str, max_tokens: int) -> int | None:
    """For SGLang's 'context length exceeded' answer: the max_tokens that fits (0: none); None for other answers."""
    if status != 400:
        return None
    if _INPUT_TOO_LONG_RE.search(text):
        return 0
    m = _CONTEXT_RE.search(text)
    if not m:
        return None
    context, prompt = int(m[1]), int(m[2])
    return max(0, min(max_tokens - 1, context - prompt))


class ChatServer:
    """One server: its health gate, its model name and context, and `complete` for one turn."""

    def __init__(self, url: str, sampling: Sampling, policy: RetryPolicy, concurrency: int):
        self.url = url.rstrip("/")
        self.sampling = sampling
        self.policy = policy
        self.concurrency = concurrency
        self.model = "default"
        self.context_len: int | None = None
        self.session: aiohttp.ClientSession | None = None
        self._health_lock = asyncio.Lock()
        self._healthy_at = 0.0
        self.down_since: float | None = None
        self.gone = False  # given up: every worker of this server stops at once
        self.requests = 0

    async def open(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.policy.read_timeout_s, sock_connect=self.policy.connect_timeout_s)
        connector = aiohttp.TCPConnector(limit=self.concurrency + 2)
        self.session = aiohttp.ClientSession(timeout=timeout, connector=connector)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def healthy(self) -> bool:
        assert self.session is not None
        try:
            async with self.session.get(f"{self.url}/health", timeout=aiohttp.ClientTimeout(total=30)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def wait_healthy(self, since: float) -> None:
        """Return once the server was seen healthy after `since`; ServerGone after `server_wait_s`."""
        async with self._health_lock:
            if self.gone:
                raise ServerGone(f"server {self.url} was given up")
            if self._healthy_at > since:
                return
            deadline = time.monotonic() + self.policy.server_wait_s
            delay = 0.5
            while True:
                if await self.healthy():
                    self._healthy_at = time.monotonic()
                    if self.down_since is not None:
                        log.warning("server %s is healthy again after %.0f s", self.url, time.time() - self.down_since)
                    self.down_since = None
                    return
                if self.down_since is None:
                    self.down_since = time.time()
                    log.warning("server %s is not answering; waiting for /health", self.url)
                if time.monotonic() > deadline:
                    self.gone = True
                    waited = self.policy.server_wait_s
                    raise ServerGone(
                        f"server {self.url} has not answered /health for {duration(waited)}; "
                        "check the SGLang service, then run the command again (it resumes)"
                    )
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 1.5)

    async def describe(self) -> None:
        """Learn the served model's name and context length from ``/v1/models`` (waits for the server)."""
        await self.wait_healthy(since=time.monotonic())
        assert self.session is not None
        try:
            async with self.session.get(f"{self.url}/v1/models") as resp:
                data = await resp.json(content_type=None)
            card = data["data"][0]
            self.model = str(card["id"])
            self.context_len = int(card["max_model_len"]) if card.get("max_model_len") else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise HsextractError(
                f"server {self.url}: /v1/models did not describe the served model ({exc}); is it an SGLang server?"
            ) from exc

    def body(
        self, messages: list[dict], tools: list[dict] | None, kwargs: dict | None, max_tokens: int | None = None
    ) -> dict[str, Any]:
        """The request: the history, the source's tools, the run's sampling. Never a request id."""
        out: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": False,
            **self.sampling.request_fields(),
        }
        if max_tokens is not None:
            out["max_tokens"] = max_tokens
        if tools:
            out["tools"] = tools
        if kwargs:
            out["chat_template_kwargs"] = kwargs
        return out

    async def complete(self, messages: list[dict], tools: list[dict] | None, kwargs: dict | None) -> Reply:
        """One reply; TurnFailed when the server refuses this history, ServerGone when it stays down."""
        assert self.session is not None
        max_tokens = self.sampling.max_new_tokens
        attempt = 0
        detail = ""
        while attempt < self.policy.max_attempts:
            attempt += 1
            started = time.monotonic()
            try:
                self.requests += 1
                async with self.session.post(
                    f"{self.url}/v1/chat/completions", json=self.body(messages, tools, kwargs, max_tokens)
                ) as resp:
                    status, text = resp.status, await resp.text()
            except asyncio.TimeoutError:
                detail = f"no answer within {duration(self.policy.read_timeout_s)}"
                continue
            except (aiohttp.ClientError, OSError) as exc:
                detail = f"{type(exc).__name__}: {str(exc)[:200]}"
                attempt -= 1  # a server that is down does not use up the turn's attempts
                await self.wait_healthy(started)
                continue
            if status == 200:
                try:
                    reply = parse_reply(_json(text))
                except ValueError as exc:
                    detail = f"bad answer: {exc}"
                    await asyncio.sleep(self.policy.delay(attempt))
                    continue
                if reply.finish_reason == "abort":
                    detail = "the server aborted the request"
                    await asyncio.sleep(self.policy.delay(attempt))
                    continue
                return reply
            room = room_left(status, text, max_tokens)
            if room is not None:
                if room < 1:
                    raise TurnFailed(CONTEXT_FULL, f"the history fills the model's context: {text[:200]}")
                max_tokens = room
                attempt -= 1
                continue
            detail = f"HTTP {status}: {text[:300]}"
            if 400 <= status < 500 and status not in (408, 429):
                raise TurnFailed(SERVER_REJECTED, detail)
            await asyncio.sleep(self.policy.delay(attempt))
        raise TurnFailed(RETRIES_EXHAUSTED, f"{attempt} attempts on {self.url}; last: {detail}")


def _json(text: str) -> Any:
    import json

    return json.loads(text)
