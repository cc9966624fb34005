"""The dataset reader: every line becomes one sample or one reject with a reason; nothing stops it."""

from __future__ import annotations

import json

import pytest
from hsextract.dataset import reader as ds
from hsextract.dataset.reader import DatasetReader, Message, Reject, Sample, count_rows, parse_line, read_dataset
from hsextract.errors import HsextractError
from hypothesis import given, settings
from hypothesis import strategies as st


def _line(obj) -> bytes:
    return json.dumps(obj).encode()


def test_sharegpt_line_becomes_messages_with_chat_template_roles():
    item = parse_line(
        0,
        _line(
            {
                "conversations": [
                    {"from": "system", "value": "Be brief."},
                    {"from": "human", "value": "Hello world"},
                    {"from": "gpt", "value": "A quick brown fox."},
                ]
            }
        ),
    )
    assert isinstance(item, Sample)
    assert item.messages == [
        Message("system", "Be brief."),
        Message("user", "Hello world"),
        Message("assistant", "A quick brown fox."),
    ]


def test_sharegpt_top_level_system_prompt_is_prepended():
    item = parse_line(
        0,
        _line(
            {
                "system": "Be brief.",
                "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}],
            }
        ),
    )
    assert [m.role for m in item.messages] == ["system", "user", "assistant"]


def test_openai_line_with_text_parts_joins_the_parts():
    item = parse_line(
        3,
        _line(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}],
                    },
                    {"role": "assistant", "content": "Paris."},
                ]
            }
        ),
    )
    assert item.index == 3 and item.line == 4
    assert item.messages[0] == Message("user", "Hello world")


def test_pretokenized_line_without_mask_trains_on_every_token():
    item = parse_line(0, _line({"input_ids": [1, 5, 9]}))
    assert item.is_tokenized and item.input_ids == [1, 5, 9] and item.loss_mask == [1, 1, 1]


def test_pretokenized_line_keeps_its_mask_and_accepts_booleans():
    item = parse_line(0, _line({"input_ids": [1, 5, 9], "loss_mask": [False, True, 1]}))
    assert item.loss_mask == [0, 1, 1]


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", ds.BLANK_LINE),
        (b"   \t", ds.BLANK_LINE),
        (b'{"messages": [', ds.MALFORMED_JSON),
        (b'{"messages": "\xff\xfe"}', ds.NOT_UTF8),
        (b"[1, 2, 3]", ds.NOT_AN_OBJECT),
        (b'{"text": "hello"}', ds.UNKNOWN_SHAPE),
        (b'{"messages": "hello"}', ds.UNKNOWN_SHAPE),
        (b'{"messages": []}', ds.EMPTY_CONVERSATION),
        (b'{"messages": ["hi"]}', ds.BAD_MESSAGE),
        (b'{"messages": [{"content": "hi"}]}', ds.BAD_MESSAGE),
        (b'{"messages": [{"role": "user", "content": 5}]}', ds.BAD_MESSAGE),
        (
            b'{"messages": [{"role": "narrator", "content": "x"}, {"role": "assistant", "content": "y"}]}',
            ds.UNKNOWN_ROLE,
        ),
        (
            b'{"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}',
            ds.TOOL_WITHOUT_CALL,
        ),
        (b'{"conversations": [{"from": "robot", "value": "x"}]}', ds.UNKNOWN_ROLE),
        (
            b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}]}',
            ds.EMPTY_CONTENT,
        ),
        (b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}', ds.EMPTY_CONTENT),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', ds.NO_ASSISTANT_TURN),
        (b'{"messages": [{"role": "user", "content": "\\ud800"}, {"role": "assistant", "content": "y"}]}', ds.NOT_UTF8),
        (b'{"input_ids": []}', ds.BAD_INPUT_IDS),
        (b'{"input_ids": [1, "2"]}', ds.BAD_INPUT_IDS),
        (b'{"input_ids": [1, -2]}', ds.BAD_INPUT_IDS),
        (b'{"input_ids": [1, 2.5]}', ds.BAD_INPUT_IDS),
        (b'{"input_ids": [1, 2], "loss_mask": [1]}', ds.BAD_LOSS_MASK),
        (b'{"input_ids": [1, 2], "loss_mask": [1, 2]}', ds.BAD_LOSS_MASK),
        (b'{"input_ids": [1, 2], "loss_mask": [0, 0]}', ds.BAD_LOSS_MASK),
    ],
)
def test_bad_line_is_rejected_with_its_reason(raw, reason):
    item = parse_line(6, raw)
    assert isinstance(item, Reject), item
    assert item.reason == reason
    assert item.to_json()["line"] == 7 and item.detail


def test_repeated_sample_is_rejected_naming_the_first_line():
    conv = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    same_again = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    items = list(DatasetReader().read_lines([_line(conv), _line({"input_ids": [1]}), _line(same_again)]))
    assert isinstance(items[0], Sample) and isinstance(items[1], Sample)
    assert isinstance(items[2], Reject) and items[2].reason == ds.DUPLICATE
    assert "line 1" in items[2].detail


def test_index_is_the_line_number_counting_blank_and_bad_lines(tmp_path):
    good = _line({"input_ids": [1, 2]})
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n".join([b"{bad", b"", good, b"\xff"]) + b"\n")
    items = list(read_dataset(path))
    assert [type(i).__name__ for i in items] == ["Reject", "Reject", "Sample", "Reject"]
    assert [i.index for i in items] == [0, 1, 2, 3]
    assert [i.line for i in items] == [1, 2, 3, 4] and {i.file for i in items} == {"d.jsonl"}


@pytest.mark.parametrize("content", [b"a", b"a\n", b"a\nb", b"a\nb\n", b"\n\n", b"a\r\nb\r\n"])
def test_count_rows_agrees_with_the_reader(tmp_path, content):
    path = tmp_path / "d.jsonl"
    path.write_bytes(content)
    assert count_rows(path) == len(list(read_dataset(path)))


def test_missing_dataset_stops_with_a_clear_message(tmp_path):
    with pytest.raises(HsextractError, match="does not exist"):
        read_dataset(tmp_path / "nope.jsonl")


# -- properties: arbitrary input never crashes the reader, every line is accounted for ------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_roles = st.sampled_from(["user", "assistant", "system", "human", "gpt", "tool", "", "Assistant", 7])
_turn = st.fixed_dictionaries(
    {},
    optional={
        "role": _roles,
        "from": _roles,
        "content": st.one_of(st.text(max_size=12), st.none(), st.integers(), st.lists(_json_values, max_size=2)),
        "value": st.one_of(st.text(max_size=12), st.none()),
    },
)
_sample_like = st.one_of(
    st.fixed_dictionaries({"messages": st.lists(_turn, max_size=4)}),
    st.fixed_dictionaries({"conversations": st.lists(_turn, max_size=4)}),
    st.fixed_dictionaries(
        {"input_ids": st.lists(st.one_of(st.integers(-3, 400), st.text(max_size=2)), max_size=5)},
        optional={"loss_mask": st.lists(st.integers(-1, 2) | st.booleans(), max_size=5)},
    ),
)


def _check_accounted(lines: list[bytes]) -> None:
    items = list(DatasetReader().read_lines(lines))
    assert len(items) == len(lines)
    for index, item in enumerate(items):
        assert item.index == index
        assert isinstance(item, (Sample, Reject))
        if isinstance(item, Sample):
            if item.is_tokenized:
                assert len(item.input_ids) == len(item.loss_mask) > 0
                assert all(isinstance(t, int) and t >= 0 for t in item.input_ids)
                assert set(item.loss_mask) <= {0, 1} and any(item.loss_mask)
            else:
                assert item.messages and any(m.role == "assistant" for m in item.messages)
                assert all(m.role in ("system", "user", "assistant", "tool") for m in item.messages)
                # An unset system prompt renders empty (OpenAI's null content); an empty user turn asks nothing.
                assert all(m.content.strip() for m in item.messages if m.role == "user")
                assert all(
                    m.content.strip() or m.tool_calls or (m.reasoning_content or "").strip()
                    for m in item.messages
                    if m.role == "assistant"
                )
        else:
            assert item.reason and json.dumps(item.to_json())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"")), max_size=8))
def test_arbitrary_bytes_never_crash_and_every_line_is_accounted_for(lines):
    _check_accounted(lines)


@settings(max_examples=300, deadline=None)
@given(st.lists(_json_values.map(lambda v: json.dumps(v).encode()), max_size=6))
def test_arbitrary_json_never_crashes_and_every_line_is_accounted_for(lines):
    _check_accounted(lines)


@settings(max_examples=400, deadline=None)
@given(st.lists(_sample_like.map(lambda v: json.dumps(v).encode()), max_size=6))
def test_sample_like_json_is_accepted_only_when_usable(lines):
    _check_accounted(lines)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=6).filter(lambda chunks: b"\n".join(chunks)))
def test_a_file_of_arbitrary_bytes_yields_one_outcome_per_line(tmp_path_factory, chunks):
    path = tmp_path_factory.mktemp("prop") / "d.jsonl"
    path.write_bytes(b"\n".join(chunks))  # not empty: an empty file is refused
    outcomes = list(read_dataset(path))
    assert len(outcomes) == count_rows(path)
