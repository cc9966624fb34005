"""Regenerate one conversation: every assistant turn, in order, on the regenerated history.

This is the pure core of ``hsextract regenerate``: it decides what each request's history is
and what becomes of each reply; how a request reaches a server is the `Complete` function it is
given (see `hsextract.regen.server`). For each turn to regenerate:

1. the history is the conversation so far as regenerated: the source's system, user and tool
   turns, and the replies the model wrote for the earlier turns (shown as ``--reasoning`` says);
2. the reply replaces the source's; its reasoning is stored in ``reasoning_content``;
3. a reply cut by the token limit is kept, marked ``truncated``, and the conversation goes on
   from it as the model wrote it; with ``drop_truncated`` the conversation is cut before it;
4. where the source's turn called tools, the reply must call the same ones (names, in order)
   for the source's results to follow it; otherwise the conversation is cut before the turn.

A conversation that ends with a user turn (or tool results) gets a reply to it too, so a dataset of prompts alone
becomes a dataset of conversations. A cut keeps what was regenerated before it and records why;
a conversation with nothing regenerated is a failure with that reason.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hsextract.dataset.conversation import Conversation, Message, ToolCall
from hsextract.regen import reasoning, tools

# Reasons (stable codes: counted in the status and written to the output and errors files).
NO_USER_TURN = "no_user_turn"
TRUNCATED = "truncated"
CONTEXT_FULL = "context_full"
SERVER_REJECTED = "server_rejected"
RETRIES_EXHAUSTED = "retries_exhausted"
EMPTY_REPLY = "empty_reply"
TOOL_CALLS_DIFFER = tools.TOOL_CALLS_DIFFER


@dataclass(frozen=True)
class Reply:
    """What the server answered for one turn."""

    message: Message  # role "assistant"
    finish_reason: str  # "stop", "length", "tool_calls"
    completion_tokens: int = 0
    prompt_tokens: int = 0


class TurnFailed(Exception):
    """The server could not answer this turn (the history fills the context, or it refused it)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


# messages (OpenAI dicts), tools (or None), chat template kwargs (or None) -> the reply
Complete = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any] | None], Awaitable[Reply]]


@dataclass(frozen=True)
class Options:
    reasoning: str = "strip-history"
    last_turn_only: bool = False
    drop_truncated: bool = False


@dataclass
class Result:
    """A regenerated conversation (messages) or a failure (reason, detail), with what happened on the way."""

    messages: list[Message] = field(default_factory=list)
    turns: int = 0  # replies regenerated and kept
    truncated: list[int] = field(default_factory=list)  # positions in `messages` of replies cut by the token limit
    cut: dict[str, Any] | None = None  # {"turn", "reason", "detail"}: where the conversation was cut and why
    completion_tokens: int = 0
    reason: str = ""  # set when the conversation failed: nothing was regenerated
    detail: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason


def targets(messages: Sequence[Message], last_turn_only: bool) -> list[int]:
    """Positions of the turns to regenerate: every assistant turn, plus a reply to a final user or tool turn."""
    out = [i for i, m in enumerate(messages) if m.role == "assistant"]
    if messages and messages[-1].role in ("user", "tool"):
        out.append(len(messages))
    return out[-1:] if last_turn_only else out


def _results_after(messages: Sequence[Message], i: int) -> list[Message]:
    out = []
    for m in messages[i + 1 :]:
        if m.role != "tool":
            break
        out.append(m)
    return out


async def regenerate(conv: Conversation, complete: Complete, opts: Options) -> Result:
    """Regenerate `conv`; raises only what `complete` raises beyond `TurnFailed` (a server gone)."""
    source = list(conv.messages)
    todo = targets(source, opts.last_turn_only)
    unusable = _nothing_to_regenerate(source, todo)
    if unusable is not None:
        return unusable
    tool_specs = list(conv.tools) if conv.tools else None
    kwargs = reasoning.template_kwargs(opts.reasoning)
    res = Result()
    out: list[Message] = []
    skip_until = 0  # source tool results already spliced in after a regenerated call
    for i in range(len(source) + 1):
        if i < skip_until:
            continue
        if i not in todo:
            if i < len(source):
                out.append(source[i])
            continue
        history = [reasoning.history_message(m, opts.reasoning).to_openai() for m in out]
        try:
            reply = await complete(history, tool_specs, kwargs)
        except TurnFailed as exc:
            return _cut(res, out, i, exc.reason, exc.detail)
        res.completion_tokens += reply.completion_tokens
        message = reasoning.normalize_reply(replace(reply.message, role="assistant"))
        source_calls = source[i].tool_calls if i < len(source) else ()
        problem = _unkeepable(reply, message, source_calls, opts)
        if problem is not None:
            return _cut(res, out, i, *problem)
        if reply.finish_reason == "length":
            res.truncated.append(len(out))
        out.append(message)
        res.turns += 1
        if source_calls:
            results = _results_after(source, i)
            out.extend(tools.splice_results(results, source_calls, message.tool_calls))
            skip_until = i + 1 + len(results)
    res.messages = out
    return res


def _nothing_to_regenerate(source: list[Message], todo: list[int]) -> Result | None:
    """The failed result of a conversation with no reply to regenerate, or None."""
    if not todo:
        return Result(reason=NO_USER_TURN, detail="no assistant turn and no final user turn to reply to")
    if not any(m.role == "user" for m in source[: todo[0]]):
        return Result(reason=NO_USER_TURN, detail=f"no user turn before the first reply to regenerate (turn {todo[0]})")
    return None


def _unkeepable(
    reply: Reply, message: Message, source_calls: Sequence[ToolCall], opts: Options
) -> tuple[str, str] | None:
    """Why a reply ends the conversation before its turn (reason, detail), or None to keep it."""
    if not (message.content.strip() or message.tool_calls or (message.reasoning_content or "").strip()):
        return EMPTY_REPLY, (
            f"the reply has no text ({reply.completion_tokens} tokens, finish reason {reply.finish_reason!r})"
        )
    if reply.finish_reason == "length" and opts.drop_truncated:
        return TRUNCATED, f"the reply reached the token limit ({reply.completion_tokens} tokens)"
    differ = tools.mismatch(source_calls, message.tool_calls)
    return None if differ is None else (TOOL_CALLS_DIFFER, differ)


def _cut(res: Result, out: list[Message], turn: int, reason: str, detail: str) -> Result:
    """End the conversation before `turn`: it keeps its regenerated replies, or fails when there are none."""
    while out and out[-1].role != "assistant":
        out.pop()  # a conversation ends with a reply, not with the question it never got
    res.truncated = [t for t in res.truncated if t < len(out)]
    if res.turns == 0:
        res.reason, res.detail = reason, detail
        res.messages = []
        return res
    res.messages = out
    res.cut = {"turn": turn, "reason": reason, "detail": detail}
    return res
