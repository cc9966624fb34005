"""The tokenizer loaded without transformers renders, tokenizes and counts exactly as transformers
does, for every template the project tests and the GPU bench's 128K word-level tokenizer; where one
of its premises fails, the client goes through transformers instead."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from hsextract.dataset.chat_template import load_tokenizer
from hsextract.dataset.direct_tokenizer import DirectTokenizer, NotDirect, load_direct
from support.tokenizer_dirs import TEMPLATE_SPECIAL_TOKENS, template_model
from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": 'The weather of a city — in <b>bold</b> & "quotes"',
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CONVERSATIONS = {
    "plain": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi <b>&amp; ü — 東京?"},
        {"role": "assistant", "content": "Hello\n\n  world "},
        {"role": "user", "content": "And again"},
        {"role": "assistant", "content": "Again."},
    ],
    "tools and reasoning": [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": "<think>look it up</think>Let me check.",
            "reasoning_content": "look it up",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "content": "sunny, 21 C", "name": "get_weather", "tool_call_id": "c1"},
        {"role": "assistant", "content": "Sunny and 21 C."},
    ],
}


def _rendered(tok, conversation, tools, add_generation_prompt) -> str | tuple[str, str]:
    try:
        return tok.apply_chat_template(
            conversation, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception as exc:  # a template's raise_exception(): both must refuse alike
        return type(exc).__name__, str(exc)


def assert_same_tokenizer(ours, theirs, texts: list[str]) -> None:
    assert len(ours) == len(theirs)
    for text in texts:
        for special in (False, True):
            mine = ours(text, add_special_tokens=special, return_offsets_mapping=True)
            auto = theirs(text, add_special_tokens=special, return_offsets_mapping=True)
            assert list(mine["input_ids"]) == list(auto["input_ids"]), (text, special)
            assert [tuple(o) for o in mine["offset_mapping"]] == [tuple(o) for o in auto["offset_mapping"]]
        ids = theirs(text, add_special_tokens=False)["input_ids"]
        assert ours.decode(ids) == theirs.decode(ids, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("template", sorted(TEMPLATE_SPECIAL_TOKENS))
def test_every_template_renders_and_tokenizes_as_transformers_does(tiny_llama, template):
    model = template_model(tiny_llama, template)
    ours, theirs = load_tokenizer(model), AutoTokenizer.from_pretrained(str(model))
    assert isinstance(ours, DirectTokenizer), "the template's model must take the direct path"
    texts = []
    for conversation in CONVERSATIONS.values():
        for tools in (None, TOOLS):
            for cut in range(1, len(conversation) + 1):
                for prompt in (False, True):
                    want = _rendered(theirs, conversation[:cut], tools, prompt)
                    assert _rendered(ours, conversation[:cut], tools, prompt) == want, (cut, tools, prompt)
                    if isinstance(want, str):
                        texts.append(want)
    assert_same_tokenizer(ours, theirs, texts)


def test_the_gpu_benchs_word_level_tokenizer_of_128k_ids_is_taken_directly_and_equal(tiny_llama, tmp_path):
    sys.path.insert(0, str(REPO / "bench" / "gpu"))
    try:
        from gen_llama8b import VOCAB, write_word_tokenizer
    finally:
        sys.path.remove(str(REPO / "bench" / "gpu"))
    model = tmp_path / "llama8b-shaped"
    model.mkdir()
    write_word_tokenizer(model, tiny_llama, VOCAB)
    shutil.copy(tiny_llama / "config.json", model / "config.json")
    ours, theirs = load_tokenizer(model), AutoTokenizer.from_pretrained(str(model))
    assert isinstance(ours, DirectTokenizer) and len(ours) == VOCAB
    text = theirs.apply_chat_template(CONVERSATIONS["plain"][:2], tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(CONVERSATIONS["plain"][:2], add_generation_prompt=True) == text
    assert_same_tokenizer(ours, theirs, [text, "w5 w128000 w77 <|user|> not-a-word"])


def test_a_tokenizer_json_that_truncates_is_not_truncated_as_transformers_calls_it(tiny_llama, tmp_path):
    model = _copy(tiny_llama, tmp_path / "truncating")
    spec = json.loads((model / "tokenizer.json").read_text())
    spec["truncation"] = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
    (model / "tokenizer.json").write_text(json.dumps(spec))
    ours, theirs = load_tokenizer(model), AutoTokenizer.from_pretrained(str(model))
    text = ours.apply_chat_template(CONVERSATIONS["plain"])
    assert len(ours(text, add_special_tokens=False)["input_ids"]) > 4
    assert_same_tokenizer(ours, theirs, [text])


def test_a_user_chat_template_replaces_the_models_own(tiny_llama):
    tok = load_tokenizer(tiny_llama, chat_template="{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    rendered = tok.apply_chat_template(CONVERSATIONS["plain"][1:3])
    assert rendered == "[user]Hi <b>&amp; ü — 東京?[assistant]Hello\n\n  world "


def _edit_config(model: Path, **changes) -> None:
    path = model / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    path.write_text(json.dumps(cfg))


def _copy(tiny_llama: Path, dst: Path) -> Path:
    shutil.copytree(tiny_llama, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    return dst


def _named_templates(model: Path) -> None:
    template = (model / "chat_template.jinja").read_text()
    (model / "chat_template.jinja").unlink()
    _edit_config(
        model,
        chat_template=[
            {"name": "default", "template": template},
            {"name": "tool_use", "template": "TOOLS " + template},
        ],
    )


def _special_token_not_in_the_file(model: Path) -> None:
    _edit_config(model, extra_special_tokens=["<|system|>", "<|user|>", "<|assistant|>", "<|not-yet-added|>"])


def _legacy_special_tokens_map(model: Path) -> None:
    _edit_config(model, added_tokens_decoder=None)
    (model / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|assistant|>"}))


def _split_special_tokens(model: Path) -> None:
    _edit_config(model, split_special_tokens=True)


@pytest.mark.parametrize(
    "change",
    [_named_templates, _special_token_not_in_the_file, _legacy_special_tokens_map, _split_special_tokens],
    ids=lambda f: f.__name__.strip("_").replace("_", " "),
)
def test_files_transformers_would_load_differently_go_through_transformers(tiny_llama, tmp_path, change):
    model = _copy(tiny_llama, tmp_path / "model")
    change(model)
    with pytest.raises(NotDirect):
        load_direct(model)
    tok = load_tokenizer(model)
    assert not isinstance(tok, DirectTokenizer)
    auto = AutoTokenizer.from_pretrained(str(model))
    conversation = CONVERSATIONS["plain"][:3]
    assert tok.apply_chat_template(conversation, tokenize=False) == auto.apply_chat_template(
        conversation, tokenize=False
    )
    assert len(tok) == len(auto)
