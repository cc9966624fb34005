"""Tool turns of a regenerated conversation: keep going where the model calls what the source called.

The source conversation has the results of the tools its assistant called. A regenerated turn
that calls the same tools, by name and in the same order, can be followed by those results
(their ``tool_call_id`` rewritten to the new calls' ids) and the conversation goes on. A turn
that calls other tools, more or fewer, or none where the source called some (or some where it
called none), has no results to follow it: the conversation is cut before that turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hsextract.dataset.conversation import Message, ToolCall

TOOL_CALLS_DIFFER = "tool_calls_differ"


def call_names(calls: Sequence[ToolCall]) -> list[str]:
    return [c.name for c in calls]


def mismatch(source: Sequence[ToolCall], regenerated: Sequence[ToolCall]) -> str | None:
    """Why the regenerated calls cannot take the source's results; None when they can."""
    want, got = call_names(source), call_names(regenerated)
    if want == got:
        return None
    return f"the source called {want or 'no tool'}, the regenerated turn called {got or 'no tool'}"


def splice_results(
    results: Sequence[Message], source: Sequence[ToolCall], regenerated: Sequence[ToolCall]
) -> list[Message]:
    """The source's tool results, answering the regenerated calls (matched by position, or by id)."""
    by_id = {c.id: i for i, c in enumerate(source) if c.id is not None}
    out = []
    for k, result in enumerate(results):
        i = by_id.get(result.tool_call_id, k) if result.tool_call_id is not None else k
        new_id = regenerated[i].id if i < len(regenerated) else None
        out.append(replace(result, tool_call_id=new_id if new_id is not None else result.tool_call_id))
    return out
