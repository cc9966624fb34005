"""Loss masks from the model's chat template: exactly the assistant replies (end-of-turn included).

The expected masks are built independently of the implementation: each template's rendering is
written out by hand as segments (non-reply text, reply text), every segment is tokenized on its
own, and the mask is 1 exactly on the reply segments' tokens. Segments are cut right after
special tokens, where the tokenizer splits anyway, so the concatenation equals the whole text's
tokenization.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hsextract.dataset.chat_template import (
    CHAT_TEMPLATE_ERROR,
    TEMPLATE_NOT_INCREMENTAL,
    TOO_FEW_LOSS_TOKENS,
    TOO_LONG,
    Encoded,
    SampleEncoder,
    load_tokenizer,
    tokenize_with_mask,
)
from hsextract.dataset.reader import BAD_INPUT_IDS, Message, Reject, Sample, ToolCall, parse_line
from hsextract.errors import HsextractError
from support.tokenizer_dirs import TEMPLATE_SPECIAL_TOKENS, template_model

Q1, A1 = "What is the capital city of France?", "The capital city of France is Paris."
Q2, A2 = "Hello world", "A quick brown fox jumps over the lazy dog."
CONV = [
    Message("system", "Be brief."),
    Message("user", Q1),
    Message("assistant", A1),
    Message("user", Q2),
    Message("assistant", A2),
]
CONV_NO_SYSTEM = CONV[1:]

# (template, conversation) -> the rendering, as (text, is_reply) segments
EXPECTED_SEGMENTS = {
    ("tiny", "system"): [
        (f"<s><|system|>Be brief.</s><|user|>{Q1}</s><|assistant|>", 0),
        (f"{A1}</s>", 1),
        (f"<|user|>{Q2}</s><|assistant|>", 0),
        (f"{A2}</s>", 1),
    ],
    ("llama3", "system"): [
        (
            "<s><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n\nBe brief."
            f"<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n{Q1}<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            0,
        ),
        (f"{A1}<|eot_id|>", 1),
        (
            f"<|start_header_id|>user<|end_header_id|>\n\n{Q2}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            0,
        ),
        (f"{A2}<|eot_id|>", 1),
    ],
    ("deepseek_v3", "system"): [
        (f"<s>Be brief.<｜User｜>{Q1}<｜Assistant｜>", 0),
        (f"{A1}<｜end▁of▁sentence｜>", 1),
        (f"<｜User｜>{Q2}<｜Assistant｜>", 0),
        (f"{A2}<｜end▁of▁sentence｜>", 1),
    ],
    ("kimi_k2", "system"): [
        (
            f"<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>{Q1}<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|>",
            0,
        ),
        (f"{A1}<|im_end|>", 1),
        (f"<|im_user|>user<|im_middle|>{Q2}<|im_end|><|im_assistant|>assistant<|im_middle|>", 0),
        (f"{A2}<|im_end|>", 1),
    ],
    # Kimi inserts a default system prompt when there is none: the mask must not move
    ("kimi_k2", "no_system"): [
        (
            "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
            f"<|im_user|>user<|im_middle|>{Q1}<|im_end|><|im_assistant|>assistant<|im_middle|>",
            0,
        ),
        (f"{A1}<|im_end|>", 1),
        (f"<|im_user|>user<|im_middle|>{Q2}<|im_end|><|im_assistant|>assistant<|im_middle|>", 0),
        (f"{A2}<|im_end|>", 1),
    ],
}


def make_tokenizer(model_dir: Path, template: str):
    """The client's tokenizer of a model like ``model_dir`` whose files carry ``template`` and its special tokens."""
    return load_tokenizer(template_model(model_dir, template))


def expected(tok, segments):
    ids, mask = [], []
    for text, is_reply in segments:
        seg = tok(text, add_special_tokens=False)["input_ids"]
        ids += seg
        mask += [is_reply] * len(seg)
    return ids, mask


@pytest.mark.parametrize(("template", "conv"), sorted(EXPECTED_SEGMENTS))
def test_loss_mask_is_exactly_the_assistant_replies(tiny_llama, template, conv):
    tok = make_tokenizer(tiny_llama, template)
    messages = CONV if conv == "system" else CONV_NO_SYSTEM
    ids, mask = tokenize_with_mask(tok, messages)
    want_ids, want_mask = expected(tok, EXPECTED_SEGMENTS[(template, conv)])
    assert ids == want_ids
    assert mask == want_mask
    end = TEMPLATE_SPECIAL_TOKENS[template][-1] if template != "tiny" else "</s>"
    assert tok.decode([t for t, m in zip(ids, mask, strict=True) if m]) == f"{A1}{end}{A2}{end}"


def test_turns_after_the_last_reply_are_not_trained_on(tiny_llama):
    tok = make_tokenizer(tiny_llama, "tiny")
    ids, mask = tokenize_with_mask(tok, [*CONV[:3], Message("user", Q2)])
    tail = tok(f"<|user|>{Q2}</s>", add_special_tokens=False)["input_ids"]
    assert ids[-len(tail) :] == tail and mask[-len(tail) :] == [0] * len(tail)
    assert tok.decode([t for t, m in zip(ids, mask, strict=True) if m]) == f"{A1}</s>"


def test_template_that_moves_a_later_system_turn_to_the_front_still_masks_exactly_the_replies(tiny_llama):
    # the DeepSeek-style template hoists every system message to the front, so a system turn
    # after the first reply changes the text before it: no prefix rendering matches the whole
    tok = make_tokenizer(tiny_llama, "deepseek_v3")
    conv = [
        Message("user", Q1),
        Message("assistant", A1),
        Message("system", "Be brief."),
        Message("user", Q2),
        Message("assistant", A2),
    ]
    got = SampleEncoder(tok, None).encode(Sample(4, messages=conv))
    assert isinstance(got, Encoded)
    assert (got.input_ids, got.loss_mask) == expected(tok, EXPECTED_SEGMENTS[("deepseek_v3", "system")])


def test_template_whose_replies_cannot_be_located_is_rejected_not_masked_wrongly(tiny_llama):
    # system text hoisted to the front, and no assistant header or end-of-turn text at all
    tok = make_tokenizer(tiny_llama, "tiny")
    tok.chat_template = (
        "{%- for m in messages if m.role == 'system' %}{{ m.content }}{% endfor %}"
        "{%- for m in messages if m.role != 'system' %}{{ m.content }} {% endfor %}"
    )
    conv = [
        Message("user", Q1),
        Message("assistant", A1),
        Message("system", "Be brief."),
        Message("user", Q2),
        Message("assistant", A2),
    ]
    got = SampleEncoder(tok, None).encode(Sample(4, messages=conv))
    assert isinstance(got, Reject) and got.reason == TEMPLATE_NOT_INCREMENTAL and got.index == 4


def test_thinking_template_that_drops_earlier_reasoning_is_masked_on_what_the_server_runs(tiny_llama):
    # Rendered whole, the first reply loses its reasoning (it precedes the last user turn), so no
    # rendering up to a turn is a prefix of the whole: the replies are found in the whole text.
    tok = make_tokenizer(tiny_llama, "qwen3_thinking")
    conv = [
        Message("system", "Be brief."),
        Message("user", Q1),
        Message("assistant", f"<think>\nR one\n</think>\n\n{A1}"),
        Message("user", Q2),
        Message("assistant", f"<think>\nR two\n</think>\n\n{A2}"),
    ]
    ids, mask = tokenize_with_mask(tok, conv)
    replies = [f"{A1}<|im_end|>\n", f"<think>\nR two\n</think>\n\n{A2}<|im_end|>\n"]
    prompts = [
        f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{Q1}<|im_end|>\n<|im_start|>assistant\n",
        f"<|im_start|>user\n{Q2}<|im_end|>\n<|im_start|>assistant\n",
    ]
    whole = prompts[0] + replies[0] + prompts[1] + replies[1]
    assert ids == tok(whole, add_special_tokens=False)["input_ids"]
    assert tok.decode([t for t, m in zip(ids, mask, strict=True) if m]) == "".join(replies)
    assert tok.decode([t for t, m in zip(ids, mask, strict=True) if not m]) == "".join(prompts)
    assert "R one" not in tok.decode(ids)


def test_template_raising_an_error_rejects_the_sample(tiny_llama):
    tok = make_tokenizer(tiny_llama, "tiny")
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    got = SampleEncoder(tok, None).encode(Sample(0, messages=CONV))
    assert isinstance(got, Reject) and got.reason == CHAT_TEMPLATE_ERROR and "alternate" in got.detail


def test_overlong_sample_is_skipped_when_configured(tiny_llama):
    tok = make_tokenizer(tiny_llama, "tiny")
    n = len(tokenize_with_mask(tok, CONV)[0])
    got = SampleEncoder(tok, n - 1, "skip").encode(Sample(2, messages=CONV))
    assert isinstance(got, Reject) and got.reason == TOO_LONG and got.to_json()["tokens"] == n


def test_overlong_sample_is_truncated_when_configured(tiny_llama):
    tok = make_tokenizer(tiny_llama, "tiny")
    ids, mask = tokenize_with_mask(tok, CONV)
    got = SampleEncoder(tok, len(ids) - 5, "truncate").encode(Sample(2, messages=CONV))
    assert isinstance(got, Encoded)
    assert got.input_ids == ids[:-5] and got.loss_mask == mask[:-5] and got.truncated_from == len(ids)


def test_truncation_that_leaves_no_reply_token_rejects_the_sample(tiny_llama):
    tok = make_tokenizer(tiny_llama, "tiny")
    got = SampleEncoder(tok, 5, "truncate").encode(Sample(2, messages=CONV))
    assert isinstance(got, Reject) and got.reason == TOO_LONG


def test_pretokenized_sample_passes_through_unchanged(tiny_llama):
    tok = make_tokenizer(tiny_llama, "tiny")
    got = SampleEncoder(tok, None, vocab_size=320).encode(Sample(1, input_ids=[1, 300, 319], loss_mask=[0, 1, 1]))
    assert got == Encoded(1, [1, 300, 319], [0, 1, 1])


def test_pretokenized_id_outside_the_vocabulary_is_rejected(tiny_llama):
    tok = make_tokenizer(tiny_llama, "tiny")
    got = SampleEncoder(tok, None, vocab_size=320).encode(Sample(1, input_ids=[1, 320], loss_mask=[1, 1]))
    assert isinstance(got, Reject) and got.reason == BAD_INPUT_IDS and "320" in got.detail


def test_model_directory_without_a_tokenizer_stops_at_once(tmp_path, tiny_llama):
    (tmp_path / "config.json").write_text((tiny_llama / "config.json").read_text())
    with pytest.raises(HsextractError, match="no usable tokenizer"):
        load_tokenizer(tmp_path)


def test_missing_model_directory_stops_at_once(tmp_path):
    with pytest.raises(HsextractError, match="does not exist"):
        load_tokenizer(tmp_path / "absent")


# -- tools, tool calls, tool results and reasoning (a template modelled on Qwen3's own) ------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOLS_SYSTEM = (
    "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query."
    "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}'
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call><|im_end|>\n"
)


def _weather(city: str, call_id: str) -> ToolCall:
    return ToolCall("get_weather", {"city": city}, call_id)


def _call_text(city: str) -> str:
    return f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'


TOOL_CONV = [
    Message("system", "Be brief."),
    Message("user", "Weather in Paris and Rome?"),
    Message("assistant", "", "I should call the tool twice.", (_weather("Paris", "c1"), _weather("Rome", "c2"))),
    Message("tool", "sunny", tool_call_id="c1"),
    Message("tool", "rainy", tool_call_id="c2"),
    Message("assistant", "Paris is sunny, Rome is rainy.", "Both results are in."),
    Message("user", "Thanks!"),
    Message("assistant", "You are welcome.", "Be polite."),
]
# The rendering of TOOL_CONV written out by hand: (prompt, reply) pairs. The reasoning of the replies
# before the last user query is not rendered by the template, so it is not trained on either.
TOOL_CONV_TURNS = [
    (
        TOOLS_SYSTEM + "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n<|im_start|>assistant\n",
        _call_text("Paris") + "\n" + _call_text("Rome") + "<|im_end|>\n",
    ),
    (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrainy\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n",
        "Paris is sunny, Rome is rainy.<|im_end|>\n",
    ),
    (
        "<|im_start|>user\nThanks!<|im_end|>\n<|im_start|>assistant\n",
        "<think>\nBe polite.\n</think>\n\nYou are welcome.<|im_end|>\n",
    ),
]


def _split(tok, ids, mask):
    on = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    off = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    return on, off


def test_tool_calls_and_shown_reasoning_are_trained_on_and_tool_results_are_not(tiny_llama):
    tok = make_tokenizer(tiny_llama, "qwen3_tools")
    ids, mask = tokenize_with_mask(tok, TOOL_CONV, [WEATHER])
    assert ids == tok("".join(p + r for p, r in TOOL_CONV_TURNS), add_special_tokens=False)["input_ids"]
    on, off = _split(tok, ids, mask)
    assert on == "".join(r for _, r in TOOL_CONV_TURNS)
    assert off == "".join(p for p, _ in TOOL_CONV_TURNS)


def test_reasoning_of_a_multi_step_tool_turn_after_the_last_query_is_trained_on(tiny_llama):
    # after the last user query the template shows every reply's reasoning, so the mask covers it
    tok = make_tokenizer(tiny_llama, "qwen3_tools")
    conv = [
        Message("user", "Weather in Paris?"),
        Message("assistant", "", "Call the tool.", (_weather("Paris", "c1"),)),
        Message("tool", "sunny", tool_call_id="c1"),
        Message("assistant", "It is sunny.", "The tool says sunny."),
    ]
    ids, mask = tokenize_with_mask(tok, conv, [WEATHER])
    on, off = _split(tok, ids, mask)
    assert on == (
        "<think>\nCall the tool.\n</think>\n\n" + _call_text("Paris") + "<|im_end|>\n"
        "<think>\nThe tool says sunny.\n</think>\n\nIt is sunny.<|im_end|>\n"
    )
    assert "sunny\n</tool_response>" in off


def test_last_turn_only_trains_on_the_last_reply_alone(tiny_llama):
    tok = make_tokenizer(tiny_llama, "qwen3_tools")
    ids, mask = tokenize_with_mask(tok, TOOL_CONV, [WEATHER], last_turn_only=True)
    assert _split(tok, ids, mask)[0] == TOOL_CONV_TURNS[-1][1]
    got = SampleEncoder(tok, None, last_turn_only=True).encode(Sample(0, messages=TOOL_CONV, tools=(WEATHER,)))
    assert (got.input_ids, got.loss_mask) == (ids, mask)


def test_sample_with_fewer_loss_tokens_than_the_minimum_is_rejected_with_the_counts(tiny_llama):
    tok = make_tokenizer(tiny_llama, "qwen3_tools")
    n = sum(tokenize_with_mask(tok, TOOL_CONV, [WEATHER])[1])
    sample = Sample(3, messages=TOOL_CONV, tools=(WEATHER,), file="part-1.parquet", row=7)
    assert isinstance(SampleEncoder(tok, None, min_loss_tokens=n).encode(sample), Encoded)
    got = SampleEncoder(tok, None, min_loss_tokens=n + 1).encode(sample)
    assert isinstance(got, Reject) and got.reason == TOO_FEW_LOSS_TOKENS
    assert got.to_json()["loss_tokens"] == n and got.to_json()["file"] == "part-1.parquet" and got.line == 8


def test_dataset_row_with_tools_as_a_json_string_and_thinking_masks_like_the_normalized_conversation(tiny_llama):
    import json

    tok = make_tokenizer(tiny_llama, "qwen3_tools")
    row = {
        "tools": json.dumps([WEATHER]),
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": None,
                "thinking": "I should call the tool twice.",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
                    },
                ],
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
            {"role": "tool", "content": "rainy", "tool_call_id": "c2"},
            {"role": "assistant", "content": "Paris is sunny, Rome is rainy.", "reasoning": "Both results are in."},
            {"role": "user", "content": "Thanks!"},
            {"role": "assistant", "content": "You are welcome.", "reasoning_content": "Be polite."},
        ],
    }
    sample = parse_line(0, json.dumps(row).encode())
    assert sample.messages == TOOL_CONV and sample.tools == (WEATHER,)
    got = SampleEncoder(tok, None).encode(sample)
    assert (got.input_ids, got.loss_mask) == tokenize_with_mask(tok, TOOL_CONV, [WEATHER])


@pytest.mark.parametrize("template", ["llama3", "qwen3_tools"])
def test_null_content_is_rendered_as_empty_in_a_tool_calling_conversation(tiny_llama, template):
    """OpenAI messages say "no content" with null: a tool-calling turn's, a tool result's, and the
    system prompt's of frameworks that write one unset. Each renders as empty content."""
    import json

    tok = make_tokenizer(tiny_llama, template)
    row = {
        "tools": [WEATHER],
        "messages": [
            {"role": "system", "content": None},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "content": None, "tool_call_id": "c1"},
            {"role": "assistant", "content": "No word from the tool."},
        ],
    }
    sample = parse_line(0, json.dumps(row).encode())
    assert isinstance(sample, Sample), sample
    empty = [
        Message("system", ""),
        Message("user", "Weather in Paris?"),
        Message("assistant", "", tool_calls=(_weather("Paris", "c1"),)),
        Message("tool", "", tool_call_id="c1"),
        Message("assistant", "No word from the tool."),
    ]
    assert sample.messages == empty
    got = SampleEncoder(tok, None).encode(sample)
    assert (got.input_ids, got.loss_mask) == tokenize_with_mask(tok, empty, [WEATHER])


def test_an_unreadable_chat_template_file_is_a_config_error_naming_it(tmp_path):
    from hsextract.dataset.chat_template import read_template_file
    from hsextract.errors import ConfigError

    missing = tmp_path / "no-such.jinja"
    with pytest.raises(ConfigError, match=f"chat template {missing}: cannot read"):
        read_template_file(str(missing))
    assert read_template_file(None) is None
