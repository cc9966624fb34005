"""Tokenize conversations with the model's own chat template and mark the assistant tokens.

The drafter must see exactly the token ids the target model serves, so the template and the
tokenizer come from the model directory. The loss mask is found without ``{% generation %}``
tags (few real templates have them): for every assistant turn the conversation is rendered up to
that turn with ``add_generation_prompt=True`` (where the reply starts) and up to and including
that turn (where it ends, end-of-turn token included); both renderings must be prefixes of the
whole conversation's rendering, and the character boundaries they give are mapped onto the
token boundaries of the whole conversation's tokenization. A token belongs to the reply when it
starts inside the reply's span, so a token merged across the boundary is assigned by where it
starts.

A template that renders earlier turns differently once later turns exist (Qwen3's thinking
templates drop the reasoning of replies before the last user turn) breaks the prefix property.
For those the replies are found in the whole rendering instead: each assistant turn starts after
the template's assistant header (what ``add_generation_prompt`` appends) and ends with its
end-of-turn text (what follows a reply in a one-turn rendering), in order, and each span must
contain the reply's visible text. A sample that fails that too is rejected with
``template_not_incremental`` rather than masked wrongly.

Tools, tool calls, tool results and reasoning go to the template as they are (``tools=`` and the
OpenAI message fields), so the mask follows the template's own rendering: whatever it renders
inside an assistant turn (its text, its tool calls, the reasoning it chooses to show) is 1, and
tool results, system and user turns are 0. ``last_turn_only`` keeps only the last assistant turn.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.dataset import defaults, tokenizer_files
from hsextract.dataset.head_tokens import tokenize_head
from hsextract.dataset.reader import BAD_INPUT_IDS, Message, Reject, Sample
from hsextract.errors import ConfigError, HsextractError
from hsextract.model_info import read_model_info
from hsextract.prompt_limit import longest_prompt, resolve_max_tokens

TOO_LONG = "too_long"
CHAT_TEMPLATE_ERROR = "chat_template_error"
TEMPLATE_NOT_INCREMENTAL = "template_not_incremental"
TOO_FEW_LOSS_TOKENS = "too_few_loss_tokens"
OVERLONG_POLICIES = ("truncate", "skip")


@dataclass
class Encoded:
    """A sample as the server will run it."""

    index: int
    input_ids: list[int]
    loss_mask: list[int]
    # when truncated: the original length, or, where only its head was tokenized, max_tokens + 1 (a
    # lower bound: hsextract.dataset.head_tokens); else 0
    truncated_from: int = 0
    file: str = ""  # where the sample came from, for failure reports
    line: int = 0


class TemplateMismatch(Exception):
    """The template's renderings are not prefixes of one another (see module docstring)."""


def read_template_file(path: str | None) -> str | None:
    """The text of a ``--chat-template`` file (None when no file is given), or a ConfigError naming it."""
    if not path:
        return None
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"chat template {path}: cannot read ({exc})") from exc


def load_tokenizer(model_dir: str | Path, chat_template: str | None = None) -> Any:
    """The model's tokenizer (fast, with offsets) and chat template; HsextractError when unusable."""
    path = Path(model_dir)
    if not path.is_dir():
        raise HsextractError(f"model directory {path} does not exist; pass --model with the served model's directory")
    try:
        tok = tokenizer_files.from_pretrained(path)
    except Exception as exc:  # transformers raises many kinds (OSError, ValueError, KeyError...)
        raise HsextractError(
            f"model directory {path}: no usable tokenizer ({type(exc).__name__}: {str(exc)[:300]}); "
            "it needs tokenizer.json or the tokenizer files of the served model"
        ) from exc
    if not getattr(tok, "is_fast", False):
        raise HsextractError(f"model directory {path}: the tokenizer is not a fast tokenizer; loss masks need offsets")
    if chat_template is not None:
        tok.chat_template = chat_template
    if not getattr(tok, "chat_template", None):
        raise HsextractError(
            f"model directory {path}: the tokenizer has no chat template; pass --chat-template FILE (a Jinja file)"
        )
    return tok


Tools = Sequence[dict] | None


def _render(tok: Any, messages: Sequence[Message], add_generation_prompt: bool, tools: Tools = None) -> str:
    text = tok.apply_chat_template(
        [m.to_template() for m in messages],
        tools=list(tools) if tools else None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
    if not isinstance(text, str):  # some versions return a list for batched input
        raise TemplateMismatch(f"chat template rendered a {type(text).__name__}, expected text")
    return text


def assistant_spans(tok: Any, messages: Sequence[Message], tools: Tools = None) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of every assistant reply in it."""
    full = _render(tok, messages, add_generation_prompt=False, tools=tools)
    try:
        return full, _incremental_spans(tok, messages, full, tools)
    except TemplateMismatch as exc:
        return full, _anchored_spans(tok, messages, full, why=str(exc), tools=tools)


def _incremental_spans(tok: Any, messages: Sequence[Message], full: str, tools: Tools) -> list[tuple[int, int]]:
    spans = []
    for i, m in enumerate(messages):
        if m.role != "assistant":
            continue
        start = _render(tok, messages[:i], add_generation_prompt=True, tools=tools)
        end = _render(tok, messages[: i + 1], add_generation_prompt=False, tools=tools)
        if not full.startswith(start) or not full.startswith(end) or len(end) < len(start):
            raise TemplateMismatch(f"rendering up to turn {i} is not a prefix of the whole conversation's rendering")
        spans.append((len(start), len(end)))
    return spans


_PROBE = "hsextract-probe-reply-7f3a"


def _anchored_spans(tok: Any, messages: Sequence[Message], full: str, why: str, tools: Tools) -> list[tuple[int, int]]:
    """Replies located in the whole rendering between the assistant header and the end-of-turn text."""
    first = next((i for i, m in enumerate(messages) if m.role == "assistant"), None)
    if first is None:
        return []
    before = _render(tok, messages[:first], add_generation_prompt=False, tools=tools)
    prompted = _render(tok, messages[:first], add_generation_prompt=True, tools=tools)
    probe = _render(tok, [*messages[:first], Message("assistant", _PROBE)], add_generation_prompt=False, tools=tools)
    header = prompted[len(before) :] if prompted.startswith(before) else ""
    end_of_turn = probe[probe.rfind(_PROBE) + len(_PROBE) :] if _PROBE in probe else ""
    if not header.strip() or not end_of_turn.strip():
        raise TemplateMismatch(f"{why}; and the template has no assistant header or end-of-turn text to find replies")
    spans, cursor = [], 0
    for i, m in enumerate(messages):
        if m.role != "assistant":
            continue
        at = full.find(header, cursor)
        if at < 0:
            raise TemplateMismatch(f"{why}; and turn {i}'s assistant header is not in the whole rendering")
        a = at + len(header)
        end = full.find(end_of_turn, a)
        if end < 0:
            raise TemplateMismatch(f"{why}; and turn {i}'s end-of-turn text is not in the whole rendering")
        b = end + len(end_of_turn)
        visible = [m.content.split("</think>")[-1].strip(), *(c.name for c in m.tool_calls)]
        if any(v not in full[a:b] for v in visible):
            raise TemplateMismatch(f"{why}; and turn {i}'s reply is not where its header and end-of-turn put it")
        spans.append((a, b))
        cursor = b
    return spans


def tokenize_with_mask(
    tok: Any, messages: Sequence[Message], tools: Tools = None, last_turn_only: bool = False
) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and its mask: 1 on assistant replies (end-of-turn included)."""
    ids, mask, _ = tokenize_head_with_mask(tok, messages, tools, last_turn_only, None)
    return ids, mask


def tokenize_head_with_mask(
    tok: Any, messages: Sequence[Message], tools: Tools, last_turn_only: bool, limit: int | None
) -> tuple[list[int], list[int], bool]:
    """`tokenize_with_mask`, or where the conversation has more than `limit` tokens, its first
    ``limit + 1`` and True (tokenized only as far as that: `hsextract.dataset.head_tokens`)."""
    text, spans = assistant_spans(tok, messages, tools)
    if last_turn_only:
        spans = spans[-1:]
    head = tokenize_head(tok, text, limit)
    starts = head.starts
    mask = [0] * len(head.ids)
    for a, b in spans:
        # tokens are in text order, so the tokens starting in [a, b) are a contiguous run
        lo = bisect.bisect_left(starts, a)
        hi = bisect.bisect_left(starts, b)
        for t in range(lo, hi):
            mask[t] = 1
    return head.ids, mask, head.more


class SampleEncoder:
    """Turns Samples into Encoded samples (or Rejects) under one tokenizer and length policy."""

    def __init__(
        self,
        tok: Any,
        max_tokens: int | None,
        overlong: str = "truncate",
        vocab_size: int | None = None,
        last_turn_only: bool = False,
        min_loss_tokens: int = 0,
    ):
        if overlong not in OVERLONG_POLICIES:
            raise HsextractError(f"overlong policy {overlong!r}; expected one of {', '.join(OVERLONG_POLICIES)}")
        if max_tokens is not None and max_tokens < 1:
            raise HsextractError(f"max tokens {max_tokens}: must be at least 1")
        self.tok = tok
        self.max_tokens = max_tokens
        self.overlong = overlong
        self.vocab_size = vocab_size or len(tok)
        self.last_turn_only = last_turn_only  # conversations only: a tokenized sample's mask is its author's
        self.min_loss_tokens = max(0, int(min_loss_tokens))

    def encode(self, sample: Sample) -> Encoded | Reject:
        """The sample as the server will run it, or a Reject naming its file and row."""
        out = self._encode(sample)
        if isinstance(out, Reject):
            out.file, out.row = sample.file, sample.row
        return out

    def _encode(self, sample: Sample) -> Encoded | Reject:
        if sample.is_tokenized:
            ids, mask = list(sample.input_ids or []), list(sample.loss_mask or [])
            bad = next((t for t in ids if t >= self.vocab_size), None)
            if bad is not None:
                detail = f"token id {bad} is outside the vocabulary (size {self.vocab_size})"
                return Reject(sample.index, BAD_INPUT_IDS, detail)
            more = False
        else:
            try:
                ids, mask, more = tokenize_head_with_mask(
                    self.tok, sample.messages or [], sample.tools, self.last_turn_only, self.max_tokens
                )
            except TemplateMismatch as exc:
                return Reject(sample.index, TEMPLATE_NOT_INCREMENTAL, str(exc))
            except Exception as exc:  # jinja2 TemplateError, raise_exception() in templates, tokenizer errors
                return Reject(sample.index, CHAT_TEMPLATE_ERROR, f"{type(exc).__name__}: {str(exc)[:200]}")
        out = self._fit(sample.index, ids, mask, more)
        if isinstance(out, Encoded) and self.min_loss_tokens and sum(out.loss_mask) < self.min_loss_tokens:
            n = sum(out.loss_mask)
            detail = f"{n} loss tokens, fewer than --min-loss-tokens {self.min_loss_tokens}"
            extra = {"loss_tokens": n, "min_loss_tokens": self.min_loss_tokens}
            return Reject(sample.index, TOO_FEW_LOSS_TOKENS, detail, extra)
        return out

    def _fit(self, index: int, ids: list[int], mask: list[int], more: bool = False) -> Encoded | Reject:
        """Cut or skip a sample over the limit; `more`: `ids` are only its head (its length is not
        known, only that it is over the limit), so the reject says "more than"."""
        n = len(ids)
        if self.max_tokens is None or n <= self.max_tokens:
            return Encoded(index, ids, mask)
        extra = {"tokens_at_least" if more else "tokens": n, "max_tokens": self.max_tokens}
        length = f"more than {self.max_tokens} tokens" if more else f"{n} tokens"
        if self.overlong == "skip":
            return Reject(index, TOO_LONG, f"{length} > max {self.max_tokens} (overlong=skip)", extra)
        ids, mask = ids[: self.max_tokens], mask[: self.max_tokens]
        if not any(mask):
            return Reject(index, TOO_LONG, f"{length}; no assistant token within the first {self.max_tokens}", extra)
        return Encoded(index, ids, mask, truncated_from=n)


def build_encoder(
    model: Path,
    chat_template: str | None,
    max_tokens: int | None,
    overlong: str,
    last_turn_only: bool = False,
    min_loss_tokens: int = 0,
    context_length: int | None = None,
    kv_pool_tokens: int | None = None,
    quiet: bool = False,
) -> SampleEncoder:
    """The client's encoder for `model`: its tokenizer and chat template, and the length limit the client
    applies (``max_tokens``, else the default, at most the longest prompt the server runs: see
    `hsextract.prompt_limit`; ``context_length`` and ``kv_pool_tokens`` are the server's settings
    where they are known, else the model's context). ``hsextract plan`` encodes with the same one;
    the client then sets the limit the running server reports (`hsextract.client.runner`), and
    says there, not here (`quiet`), when it lowers ``max_tokens``."""
    info = read_model_info(model)
    tok = load_tokenizer(model, chat_template)
    context = context_length or info.context_length
    limit = resolve_max_tokens(
        max_tokens, defaults.MAX_TOKENS, longest_prompt(context, kv_pool_tokens), f"a context of {context}", quiet
    )
    return SampleEncoder(tok, limit, overlong, info.vocab_size or None, last_turn_only, min_loss_tokens)
