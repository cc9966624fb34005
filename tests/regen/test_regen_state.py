"""What a regeneration run keeps on disk and reads back: the done set, torn lines, settings, sampling,
and the server's answers (parsed without a server)."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from hsextract.capture.core import CaptureSettings
from hsextract.dataset.conversation import Conversation, Message
from hsextract.errors import ConfigError, HsextractError
from hsextract.regen import sampling
from hsextract.regen.server import parse_reply, room_left
from hsextract.regen.store import Store, conversation_key, repair_torn_tail
from hsextract.staging.records import make_rid
from hypothesis import given, settings
from hypothesis import strategies as st


def test_done_set_is_rebuilt_from_the_output_and_errors_files(tmp_path):
    s = Store(tmp_path)
    s.open()
    s.write_ok({"key": "id:1", "messages": []})
    s.write_error({"key": "row:d.jsonl:3", "reason": "malformed_json"})
    s.close()
    again = Store(tmp_path)
    again.open()
    assert again.done == {"id:1", "row:d.jsonl:3"} and again.ok_keys == {"id:1"}
    again.close()


@pytest.mark.parametrize("tail", [b'{"key": "id:2", "mess', b"{", b'{"key": "id:2"}'])
def test_a_torn_last_line_is_cut_and_its_conversation_is_done_again(tmp_path, tail):
    (tmp_path / "conversations.jsonl").write_bytes(b'{"key": "id:1"}\n' + tail)
    s = Store(tmp_path)
    s.open()
    assert s.done == {"id:1"}
    s.write_ok({"key": "id:2"})
    s.close()
    lines = (tmp_path / "conversations.jsonl").read_bytes().splitlines()
    assert [json.loads(x)["key"] for x in lines] == ["id:1", "id:2"]


@settings(deadline=None, max_examples=100)
@given(st.binary(max_size=200))
def test_torn_tail_repair_leaves_whole_lines_only(data):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "f"
        p.write_bytes(data)
        removed = repair_torn_tail(p)
        after = p.read_bytes()
        assert after == data[: len(data) - removed]
        assert after == b"" or after.endswith(b"\n")
        assert b"\n" not in data[len(after) :]


def test_a_line_that_is_not_a_record_stops_the_run_naming_it(tmp_path):
    (tmp_path / "conversations.jsonl").write_text('{"key": "id:1"}\nhello\n')
    with pytest.raises(HsextractError, match="line 2 is not a record"):
        Store(tmp_path).open()


def test_resuming_with_other_settings_is_refused_naming_them(tmp_path):
    s = Store(tmp_path)
    s.open()
    s.check_settings({"model": "m", "reasoning": "keep"})
    s.check_settings({"model": "m", "reasoning": "keep"})
    with pytest.raises(ConfigError, match="reasoning: 'keep' then, 'disable' now"):
        s.check_settings({"model": "m", "reasoning": "disable"})
    s.close()


def test_key_is_the_rows_id_else_a_hash_of_all_the_model_is_given():
    a = Conversation((Message("user", "hi"), Message("assistant", "yo")))
    assert conversation_key(Conversation(a.messages, None, "42")) == "id:42"
    assert conversation_key(a) == conversation_key(Conversation(a.messages))
    assert conversation_key(a) != conversation_key(
        Conversation(a.messages, ({"type": "function", "function": {"name": "f"}},))
    )
    assert re.fullmatch(r"sha:[0-9a-f]{32}", conversation_key(a))


# -- sampling ------------------------------------------------------------------------------------------


def test_sampling_defaults_come_from_the_generation_config_and_flags_win(tmp_path):
    assert sampling.resolve(tmp_path, None).request_fields() == {"temperature": 0.0, "max_tokens": 4096}
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20}))
    got = sampling.resolve(tmp_path, None)
    assert got.request_fields() == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 4096}
    assert got.source.endswith("generation_config.json")
    assert sampling.resolve(tmp_path, None, temperature=0.0, top_k=5).request_fields()["top_k"] == 5
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.7}))
    assert sampling.resolve(tmp_path, None).temperature == 0.0


def test_max_new_tokens_is_bounded_by_the_context():
    assert sampling.resolve(None, 2048).max_new_tokens == 2047
    assert sampling.resolve(None, 2048, max_new_tokens=100).max_new_tokens == 100
    with pytest.raises(ConfigError):
        sampling.resolve(None, None, max_new_tokens=0)


# -- the server's answers --------------------------------------------------------------------------------


def test_chat_completion_with_reasoning_and_tool_calls_becomes_a_reply():
    r = parse_reply(
        {
            "choices": [
                {
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "reasoning_content": "think",
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "index": 0,
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                            }
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": 30, "completion_tokens": 12},
        }
    )
    assert r.message.content == "" and r.message.reasoning_content == "think"
    assert r.message.tool_calls[0].arguments == {"city": "Paris"} and r.message.tool_calls[0].id == "call_1"
    assert (r.finish_reason, r.completion_tokens, r.prompt_tokens) == ("tool_calls", 12, 30)
    with pytest.raises(ValueError):
        parse_reply({"choices": []})


def test_sglangs_context_length_answer_gives_the_room_left():
    text = (
        '{"object":"error","message":"Requested token count exceeds the model\'s maximum context length of 2048 '
        "tokens. You requested a total of 2148 tokens: 1900 tokens from the input messages and 248 tokens for the "
        'completion. Please reduce..."}'
    )
    assert room_left(400, text, 248) == 148
    assert room_left(400, "The input (2100 tokens) is longer than the model's context length (2048 tokens).", 9) == 0
    assert room_left(400, "something else", 9) is None
    assert room_left(500, text, 248) is None


def test_the_request_id_sglang_gives_chat_completions_never_matches_a_capture_prefix():
    # SGLang 0.5.23 gives a request without "rid" uuid.uuid4().hex (io_struct.GenerateReqInput): no dash,
    # while the capture takes only "<prefix>-..." ids; the regenerator never sends a rid of its own.
    for prefix in ("hsx", "a", "0", "deadbeef", "x.y_z"):
        settings = CaptureSettings(rid_prefix=prefix, layers=None, hidden_size=64)
        assert settings.wants(make_rid(prefix, "0123abcd", 7))
        assert not any(settings.wants(uuid.uuid4().hex) for _ in range(200))
