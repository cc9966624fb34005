"""Reasoning in regenerated replies: where it is stored, and what the next turn's history shows.

A thinking model's reply has reasoning and an answer. With SGLang's reasoning parser on, the
server returns them apart (``reasoning_content`` and ``content``); without it the answer text
holds a ``<think>...</think>`` block, which `split_reasoning` takes apart the same way, so the
stored turn looks the same either way.

What a later turn's request shows of earlier replies is the ``--reasoning`` mode:

* ``keep``: the reasoning goes back in the history (``reasoning_content``); the chat template
  decides what to render (Qwen3's shows it only after the last user query);
* ``strip-history``: the history carries the answers only, as chat clients send them and as
  thinking templates expect; the stored dataset still has every turn's reasoning;
* ``disable``: thinking is switched off in the template (``enable_thinking: false``).
"""

from __future__ import annotations

from dataclasses import replace

from hsextract.dataset.conversation import Message

MODES = ("keep", "strip-history", "disable")
THINK_START, THINK_END = "<think>", "</think>"


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, answer) of a reply's text; (None, text) when it has no closed think block.

    A reply whose template opens ``<think>`` in the prompt starts without the opening tag, so
    everything before ``</think>`` is the reasoning either way.
    """
    if THINK_END not in text:
        return None, text
    head, _, answer = text.partition(THINK_END)
    reasoning = head.split(THINK_START, 1)[-1] if THINK_START in head else head
    return reasoning.strip("\n"), answer.lstrip("\n")


def normalize_reply(message: Message) -> Message:
    """A reply with its reasoning in ``reasoning_content``, whether or not the server parsed it out."""
    if message.reasoning_content is not None:
        return message
    reasoning, answer = split_reasoning(message.content)
    if reasoning is None:
        return message
    return replace(message, content=answer, reasoning_content=reasoning)


def history_message(message: Message, mode: str) -> Message:
    """How an earlier turn is shown in the request for a later one."""
    if message.role != "assistant" or mode == "keep":
        return message
    answer = split_reasoning(message.content)[1]
    return replace(message, content=answer, reasoning_content=None)


def template_kwargs(mode: str) -> dict | None:
    """The ``chat_template_kwargs`` of every request in this mode."""
    return {"enable_thinking": False} if mode == "disable" else None
