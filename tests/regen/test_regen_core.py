"""The regeneration of one conversation: which turns, on which history, and what becomes of each reply.

The server is replaced by a script of replies here (the core is pure); the same behaviours are
checked against the real SGLang server in test_regen_server.py.
"""

from __future__ import annotations

import asyncio

from hsextract.dataset.conversation import Conversation, Message, ToolCall
from hsextract.regen import core, reasoning, tools
from hsextract.regen.core import Options, Reply, TurnFailed, regenerate

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


class Script:
    """Answers each request with the next reply; keeps every request it was sent."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.sent: list[tuple[list[dict], list | None, dict | None]] = []

    async def __call__(self, messages, tools_, kwargs):
        self.sent.append((messages, tools_, kwargs))
        r = self.replies.pop(0)
        if isinstance(r, Exception):
            raise r
        return r


def reply(text="", reasoning_content=None, calls=(), finish="stop", tokens=3):
    return Reply(Message("assistant", text, reasoning_content, tuple(calls)), finish, tokens)


def run(conv, script, **opts):
    return asyncio.run(regenerate(conv, script, Options(**opts)))


def conv(*messages, tools_=None, id_=None):
    return Conversation(tuple(messages), tools_, id_)


U1, U2 = Message("user", "first question"), Message("user", "second question")
A1, A2 = Message("assistant", "source answer one"), Message("assistant", "source answer two")


def test_every_assistant_turn_is_regenerated_on_the_regenerated_history():
    s = Script(reply("new one"), reply("new two"))
    res = run(conv(Message("system", "sys"), U1, A1, U2, A2), s)
    assert [m.content for m in res.messages] == ["sys", "first question", "new one", "second question", "new two"]
    assert [m["content"] for m in s.sent[1][0]] == ["sys", "first question", "new one", "second question"]
    assert res.turns == 2 and res.cut is None and res.completion_tokens == 6


def test_last_turn_only_keeps_the_source_replies_before_it():
    s = Script(reply("new two"))
    res = run(conv(U1, A1, U2, A2), s, last_turn_only=True)
    assert [m.content for m in res.messages] == ["first question", "source answer one", "second question", "new two"]
    assert len(s.sent) == 1 and s.sent[0][0][1]["content"] == "source answer one"


def test_a_final_user_turn_gets_a_reply_so_prompts_alone_become_conversations():
    s = Script(reply("answer"))
    res = run(conv(U1), s)
    assert [m.role for m in res.messages] == ["user", "assistant"] and res.turns == 1


def test_conversation_without_a_user_turn_fails_with_its_reason():
    res = run(conv(Message("system", "sys"), A1), Script())
    assert not res.ok and res.reason == core.NO_USER_TURN


def test_truncated_reply_is_kept_marked_and_the_conversation_goes_on():
    s = Script(reply("cut sho", finish="length"), reply("two"))
    res = run(conv(U1, A1, U2, A2), s)
    assert [m.content for m in res.messages][1:] == ["cut sho", "second question", "two"]
    assert res.truncated == [1] and s.sent[1][0][1]["content"] == "cut sho"


def test_drop_truncated_cuts_before_the_truncated_reply():
    s = Script(reply("one"), reply("cut sho", finish="length"))
    res = run(conv(U1, A1, U2, A2), s, drop_truncated=True)
    assert [m.content for m in res.messages] == ["first question", "one"]
    assert res.cut == {"turn": 3, "reason": core.TRUNCATED, "detail": res.cut["detail"]} and res.truncated == []
    first = run(conv(U1, A1), Script(reply("x", finish="length")), drop_truncated=True)
    assert not first.ok and first.reason == core.TRUNCATED


def test_a_turn_the_server_refuses_cuts_the_conversation_there_keeping_the_turns_before():
    s = Script(reply("one"), TurnFailed(core.CONTEXT_FULL, "the history fills the context"))
    res = run(conv(U1, A1, U2, A2), s)
    assert [m.content for m in res.messages] == ["first question", "one"]
    assert res.cut["reason"] == core.CONTEXT_FULL and res.ok


# -- reasoning ----------------------------------------------------------------------------------------

THINKING = reply("the answer", "step by step")


def test_reasoning_is_stored_per_turn_and_kept_in_the_history_with_keep():
    s = Script(THINKING, reply("two"))
    res = run(conv(U1, A1, U2, A2), s, reasoning="keep")
    assert res.messages[1].reasoning_content == "step by step"
    assert s.sent[1][0][1] == {"role": "assistant", "content": "the answer", "reasoning_content": "step by step"}
    assert s.sent[0][2] is None


def test_strip_history_stores_the_reasoning_but_never_sends_it_back():
    s = Script(THINKING, reply("two"))
    res = run(conv(U1, A1, U2, A2), s, reasoning="strip-history")
    assert res.messages[1].reasoning_content == "step by step"
    assert s.sent[1][0][1] == {"role": "assistant", "content": "the answer"}


def test_disable_switches_thinking_off_in_every_request():
    s = Script(reply("one"), reply("two"))
    run(conv(U1, A1, U2, A2), s, reasoning="disable")
    assert [k for _, _, k in s.sent] == [{"enable_thinking": False}] * 2


def test_think_tags_in_the_text_of_a_server_without_a_reasoning_parser_are_split_the_same_way():
    s = Script(reply("<think>\nstep by step\n</think>\n\nthe answer"), reply("two"))
    res = run(conv(U1, A1, U2, A2), s, reasoning="strip-history")
    assert (res.messages[1].reasoning_content, res.messages[1].content) == ("step by step", "the answer")
    assert s.sent[1][0][1]["content"] == "the answer"


def test_split_reasoning_handles_templates_that_open_the_think_tag_in_the_prompt():
    assert reasoning.split_reasoning("plain answer") == (None, "plain answer")
    assert reasoning.split_reasoning("<think>\nA\n</think>\n\nB") == ("A", "B")
    assert reasoning.split_reasoning("A\n</think>\n\nB") == ("A", "B")
    assert reasoning.split_reasoning("<think>\n\n</think>\n\nB") == ("", "B")


def test_source_reasoning_in_a_kept_earlier_turn_follows_the_mode_too():
    a1 = Message("assistant", "source one", "source thoughts")
    for mode, want in (("keep", "source thoughts"), ("strip-history", None)):
        s = Script(reply("two"))
        run(conv(U1, a1, U2, A2), s, reasoning=mode, last_turn_only=True)
        assert s.sent[0][0][1].get("reasoning_content") == want


# -- tools --------------------------------------------------------------------------------------------


def call(name, cid, **args):
    return ToolCall(name, args, cid)


TOOL_CONV = conv(
    U1,
    Message("assistant", "", None, (call("get_weather", "src1", city="Paris"), call("get_time", "src2"))),
    Message("tool", "sunny", tool_call_id="src1"),
    Message("tool", "noon", tool_call_id="src2"),
    Message("assistant", "Sunny at noon."),
    tools_=(WEATHER,),
)


def test_same_tool_calls_get_the_source_results_spliced_with_the_new_call_ids():
    s = Script(
        reply("", calls=[call("get_weather", "new1", city="Rome"), call("get_time", "new2")]), reply("Rainy at noon.")
    )
    res = run(TOOL_CONV, s)
    assert [m.role for m in res.messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [(m.content, m.tool_call_id) for m in res.messages[2:4]] == [("sunny", "new1"), ("noon", "new2")]
    assert res.messages[1].tool_calls[0].arguments == {"city": "Rome"}, "the model's own arguments are kept"
    assert s.sent[0][1] == [WEATHER] and s.sent[1][1] == [WEATHER]
    history = s.sent[1][0]
    assert history[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    assert history[2] == {"role": "tool", "content": "sunny", "tool_call_id": "new1"}


def test_other_tool_calls_cut_the_conversation_before_the_turn_with_the_reason():
    s = Script(reply("", calls=[call("get_time", "n1")]))
    res = run(TOOL_CONV, s)
    assert not res.ok and res.reason == tools.TOOL_CALLS_DIFFER
    assert "get_weather" in res.detail and "get_time" in res.detail


def test_no_tool_call_where_the_source_called_one_cuts_later_turns_and_keeps_earlier_ones():
    c = conv(U1, A1, *TOOL_CONV.messages, tools_=(WEATHER,))
    s = Script(reply("one"), reply("I will not call anything."))
    res = run(c, s)
    assert [m.content for m in res.messages] == ["first question", "one"]
    assert res.cut["turn"] == 3 and res.cut["reason"] == tools.TOOL_CALLS_DIFFER


def test_a_tool_call_where_the_source_answered_in_words_is_cut_too():
    s = Script(reply("", calls=[call("get_weather", "n1")]))
    res = run(conv(U1, A1, tools_=(WEATHER,)), s)
    assert not res.ok and res.reason == tools.TOOL_CALLS_DIFFER


def test_results_without_ids_are_matched_to_the_new_calls_by_position():
    src = (call("a", None), call("b", None))
    results = [Message("tool", "ra"), Message("tool", "rb")]
    spliced = tools.splice_results(results, src, (call("a", "x"), call("b", "y")))
    assert [m.tool_call_id for m in spliced] == ["x", "y"]


def test_a_reply_with_no_text_cuts_the_conversation_before_it():
    s = Script(reply("one"), reply(" \n "))
    res = run(conv(U1, A1, U2, A2), s)
    assert [m.content for m in res.messages] == ["first question", "one"] and res.cut["reason"] == core.EMPTY_REPLY
    thinking_only = run(conv(U1, A1), Script(reply("", "all thought", finish="length")))
    assert thinking_only.ok and thinking_only.messages[1].reasoning_content == "all thought"
