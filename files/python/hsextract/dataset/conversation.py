"""The one conversation model every part of hsextract speaks: OpenAI chat messages, normalized.

Datasets arrive as ShareGPT (``from``/``value``), OpenAI (``role``/``content``), with tools in a
``tools`` column (a list, or a JSON string of one), assistant ``tool_calls``, ``role: "tool"``
results and reasoning under three names (``reasoning_content``, ``thinking``, ``reasoning``).
They are all turned into `Message`s here, once, so the extraction client (chat template and
loss mask) and the regenerator (requests to ``/v1/chat/completions``, and the dataset it writes)
see the same thing:

* ``role``: ``system``, ``user``, ``assistant`` or ``tool``;
* ``content``: text (a list of text parts is joined; ``null`` is empty, as in OpenAI's messages: an
  assistant turn that only calls tools has "", and so may a system turn, rendered empty);
* ``reasoning_content``: the assistant's reasoning, whatever the source called it;
* ``tool_calls``: `ToolCall`s (name, arguments as an object where the source's JSON string is one);
* ``tool_call_id``: on tool results, the call it answers.

The functions raise `BadConversation` with a stable reason code and a detail that names the
turn, so a reader can turn any bad row into a reject without stopping.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Reject reason codes (stable: counted in summaries and grepped in rejects files).
UNKNOWN_SHAPE = "unknown_shape"
EMPTY_CONVERSATION = "empty_conversation"
BAD_MESSAGE = "bad_message"
UNKNOWN_ROLE = "unknown_role"
EMPTY_CONTENT = "empty_content"
NO_ASSISTANT_TURN = "no_assistant_turn"
NOT_UTF8 = "not_utf8"
BAD_TOOL_CALL = "bad_tool_call"
BAD_TOOLS = "bad_tools"
TOOL_WITHOUT_CALL = "tool_without_call"

ROLES = ("system", "user", "assistant", "tool")
# Role names as they appear in the wild, mapped to the chat-template roles.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",  # LLaMA-Factory's ShareGPT tool results
    "function_call": "assistant",  # LLaMA-Factory: the value is the call as JSON
}
OPENAI_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "tool": "tool", "function": "tool"}
# Where datasets keep an assistant turn's reasoning, first match wins.
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning", "thinking_content")


class BadConversation(Exception):
    """A row that cannot be a conversation; `reason` is a stable code, `detail` names the turn."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ToolCall:
    """One function call of an assistant turn."""

    name: str
    arguments: Any  # a dict where the source gave an object (or a JSON string of one), else the string
    id: str | None = None

    def arguments_json(self) -> str:
        """The arguments as OpenAI's wire format wants them: a JSON string."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": self.arguments_json()}}
        if self.id is not None:
            out["id"] = self.id
        return out

    def to_template(self) -> dict[str, Any]:
        """What chat templates expect: arguments as an object (Llama 3.1 renders them with ``tojson``)."""
        out: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if self.id is not None:
            out["id"] = self.id
        return out


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str = ""
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The message as an OpenAI chat request (and the regenerated dataset) carries it."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    def to_template(self) -> dict[str, Any]:
        """The message as ``apply_chat_template`` takes it (tool call arguments as objects)."""
        out = self.to_openai()
        if self.tool_calls:
            out["tool_calls"] = [c.to_template() for c in self.tool_calls]
        return out


@dataclass(frozen=True)
class Conversation:
    """Messages, the tools offered to the model, and the sample's own id when the row has one."""

    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] | None = None
    id: str | None = None

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.id is not None:
            out["id"] = self.id
        out["messages"] = [m.to_openai() for m in self.messages]
        if self.tools:
            out["tools"] = list(self.tools)
        return out


def _text(content: object, where: str, allow_empty: bool = False) -> str:
    """The text of a message's content: a string, or OpenAI's list of text parts joined."""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise BadConversation(BAD_MESSAGE, f"{where}: content part {str(part)[:60]!r} is not a text part")
        text = "".join(parts)
    elif content is None:  # OpenAI's "no content" (a tool-calling turn's, a default system prompt's): empty
        text = ""
    else:
        raise BadConversation(BAD_MESSAGE, f"{where}: content is a {type(content).__name__}, expected a string")
    if not allow_empty and not text.strip():
        raise BadConversation(EMPTY_CONTENT, f"{where}: content is empty")
    _check_utf8(text, where)
    return text


def _check_utf8(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadConversation(NOT_UTF8, f"{where}: text has a lone surrogate escape (\\ud800-\\udfff)") from None


def _json_value(value: object, where: str, reason: str) -> object:
    """A JSON string decoded (datasets often store nested columns as strings), anything else as is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            raise BadConversation(reason, f"{where} is a string that is not JSON") from None
    return value


def _drop_nulls(value: object) -> object:
    """Arrow tables pad the struct columns of tool schemas with nulls for keys a row lacks."""
    if isinstance(value, Mapping):
        return {str(k): _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def parse_tools(value: object) -> tuple[dict[str, Any], ...] | None:
    """The ``tools`` column: a list of OpenAI tool specs (or bare functions), or a JSON string of one."""
    if value is None:
        return None
    value = _json_value(value, "'tools'", BAD_TOOLS)
    if not isinstance(value, list):
        raise BadConversation(BAD_TOOLS, f"'tools' is a {type(value).__name__}, expected a list of tool specs")
    tools = []
    for i, spec in enumerate(value):
        spec = _drop_nulls(_json_value(spec, f"tools[{i}]", BAD_TOOLS))
        if not isinstance(spec, Mapping):
            raise BadConversation(BAD_TOOLS, f"tools[{i}] is a {type(spec).__name__}, expected an object")
        fn = spec.get("function") if "function" in spec else spec
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadConversation(BAD_TOOLS, f"tools[{i}] has no function name")
        tools.append({"type": spec.get("type", "function"), "function": dict(fn)} if fn is spec else dict(spec))
    return tuple(tools) or None


def parse_tool_call(call: object, where: str) -> ToolCall:
    call = _json_value(call, where, BAD_TOOL_CALL)
    if not isinstance(call, Mapping):
        raise BadConversation(BAD_TOOL_CALL, f"{where} is a {type(call).__name__}, expected an object")
    fn = call.get("function") if call.get("function") is not None else call
    if not isinstance(fn, Mapping):
        raise BadConversation(BAD_TOOL_CALL, f"{where}.function is not an object")
    name = fn.get("name")
    if not isinstance(name, str) or not name.strip():
        raise BadConversation(BAD_TOOL_CALL, f"{where} has no function name")
    _check_utf8(name, where)
    args = fn.get("arguments", fn.get("parameters"))
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            decoded = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            decoded = None
        if isinstance(decoded, dict):
            args = decoded
        else:
            _check_utf8(args, where)
    elif not isinstance(args, Mapping):
        raise BadConversation(BAD_TOOL_CALL, f"{where}: arguments are a {type(args).__name__}, expected an object")
    else:
        try:
            json.dumps(args)
        except (TypeError, ValueError):
            raise BadConversation(BAD_TOOL_CALL, f"{where}: arguments are not JSON values") from None
        args = dict(args)
    call_id = call.get("id")
    return ToolCall(name, args, None if call_id is None else str(call_id))


def _tool_calls(value: object, where: str) -> tuple[ToolCall, ...]:
    if value is None:
        return ()
    value = _json_value(value, f"{where}.tool_calls", BAD_TOOL_CALL)
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list):
        raise BadConversation(BAD_TOOL_CALL, f"{where}.tool_calls is a {type(value).__name__}, expected a list")
    return tuple(parse_tool_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(value))


def _reasoning(turn: Mapping[str, Any], where: str) -> str | None:
    for key in REASONING_KEYS:
        value = turn.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise BadConversation(BAD_MESSAGE, f"{where}.{key} is a {type(value).__name__}, expected a string")
        _check_utf8(value, where)
        return value
    return None


def parse_messages(
    turns: object, key: str, role_key: str, text_key: str, roles: Mapping[str, str], require_assistant: bool = True
) -> tuple[Message, ...]:
    """The turns of one row as Messages; BadConversation naming the turn when they cannot be."""
    turns = _json_value(turns, f"'{key}'", UNKNOWN_SHAPE)
    if not isinstance(turns, list):
        raise BadConversation(UNKNOWN_SHAPE, f"'{key}' is a {type(turns).__name__}, expected a list of turns")
    if not turns:
        raise BadConversation(EMPTY_CONVERSATION, f"'{key}' is empty")
    out: list[Message] = []
    for i, turn in enumerate(turns):
        where = f"{key}[{i}]"
        if not isinstance(turn, Mapping):
            raise BadConversation(BAD_MESSAGE, f"{where} is a {type(turn).__name__}, expected an object")
        role_name = turn.get(role_key)
        if not isinstance(role_name, str) or not role_name:
            raise BadConversation(BAD_MESSAGE, f"{where} has no '{role_key}'")
        lowered = role_name.strip().lower()
        role = roles.get(lowered)
        if role is None:
            raise BadConversation(
                UNKNOWN_ROLE, f"{where}: role {role_name[:40]!r}; expected one of {', '.join(sorted(roles))}"
            )
        if lowered == "function_call":  # the value is the call itself
            out.append(Message("assistant", "", _reasoning(turn, where), _tool_calls(turn.get(text_key), where)))
            continue
        out.append(_message(role, turn, text_key, where))
    _check_order(out, key, require_assistant)
    return tuple(out)


def _message(role: str, turn: Mapping[str, Any], text_key: str, where: str) -> Message:
    if role == "assistant":
        calls = _tool_calls(turn.get("tool_calls"), where)
        if not calls and turn.get("function_call") is not None:  # OpenAI's legacy single call
            calls = (parse_tool_call(turn["function_call"], f"{where}.function_call"),)
        thought = _reasoning(turn, where)
        # a turn that only calls tools, or only thinks (a reply cut by the token limit), has no text
        content = _text(turn.get(text_key), where, allow_empty=bool(calls) or bool(thought and thought.strip()))
        return Message("assistant", content, thought, calls)
    if role == "tool":
        call_id = turn.get("tool_call_id")
        return Message(
            "tool",
            _text(turn.get(text_key), where, allow_empty=True),
            tool_call_id=None if call_id is None else str(call_id),
        )
    # An empty system prompt renders as one (frameworks write `"content": null` where none was set);
    # an empty user turn asks nothing, so it is refused.
    return Message(role, _text(turn.get(text_key), where, allow_empty=role == "system"))


def _check_order(messages: Sequence[Message], key: str, require_assistant: bool = True) -> None:
    """Tool results must answer a call; at least one assistant turn must be there to train on (unless
    the conversation is a prompt to be answered: `require_assistant=False`)."""
    calls: tuple[ToolCall, ...] = ()
    for i, m in enumerate(messages):
        if m.role == "assistant":
            calls = m.tool_calls
        elif m.role == "tool":
            if not calls:
                raise BadConversation(TOOL_WITHOUT_CALL, f"{key}[{i}]: a tool result with no tool call before it")
            ids = {c.id for c in calls if c.id is not None}
            if m.tool_call_id is not None and ids and m.tool_call_id not in ids:
                detail = f"{key}[{i}]: tool_call_id {m.tool_call_id[:40]!r} answers no call of the turn before"
                raise BadConversation(TOOL_WITHOUT_CALL, detail)
        else:
            calls = ()
    if require_assistant and not any(m.role == "assistant" for m in messages):
        raise BadConversation(NO_ASSISTANT_TURN, f"'{key}' has no assistant turn, so no token would be trained on")


def sample_id(obj: Mapping[str, Any]) -> str | None:
    """The row's own id (``id``, else ``conversation_id``), as text; None when it has none."""
    for key in ("id", "conversation_id"):
        value = obj.get(key)
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (str, int)):
            text = str(value)
            if text.strip():
                _check_utf8(text, f"'{key}'")
                return text
    return None


def parse_conversation(obj: Mapping[str, Any], require_assistant: bool = True) -> Conversation:
    """A ShareGPT or OpenAI row as a Conversation; BadConversation saying why it cannot be one."""
    if obj.get("conversations") is not None:  # a table row has every column, null where it has none
        msgs = list(
            parse_messages(obj["conversations"], "conversations", "from", "value", SHAREGPT_ROLES, require_assistant)
        )
        system = obj.get("system")
        if isinstance(system, str) and system.strip() and msgs[0].role != "system":
            _check_utf8(system, "'system'")
            msgs.insert(0, Message("system", system))
        messages = tuple(msgs)
    elif obj.get("messages") is not None:
        messages = parse_messages(obj["messages"], "messages", "role", "content", OPENAI_ROLES, require_assistant)
    else:
        keys = ", ".join(sorted(map(str, obj))[:8]) or "none"
        raise BadConversation(UNKNOWN_SHAPE, f"no 'conversations', 'messages' or 'input_ids' key (keys: {keys})")
    tools = parse_tools(obj.get("tools"))
    return Conversation(messages, tools, sample_id(obj))
