"""The generic fast tokenizer and its chat template, loaded from the model's files without transformers.

For a model whose files name the generic fast tokenizer (`hsextract.dataset.tokenizer_files`),
transformers adds nothing to ``tokenizer.json`` that the client uses: its tokens and offsets are
the ``tokenizers`` library's, and its chat template is rendered by Jinja in a sandbox with a few
helpers. Importing transformers costs seconds (2.2 s on the H200 host, plus torch through its GGUF
utilities: 4.1 s; `docs/gpu-validation.md`), and loading the tokenizer through it a second or
more on top; this module imports ``tokenizers`` and ``jinja2`` only, well under a second.

It is taken only where its premises hold (`load_direct` says why not otherwise, and the caller
goes through transformers):

* the chat template is one text (``chat_template.jinja``, else ``tokenizer_config.json``'s), not a
  set of named templates;
* every special token the config names (``bos_token`` ... ``mask_token``, ``extra_special_tokens``)
  and every entry of ``added_tokens_decoder`` is already an added token of ``tokenizer.json``,
  with the same id (transformers would add the missing ones, changing ids);
* no legacy ``special_tokens_map.json`` or ``added_tokens.json`` is merged (they are, when the
  config has no ``added_tokens_decoder``), and special tokens are not split.

The rendering follows transformers' ``render_jinja_template``: an immutable sandbox with
``trim_blocks`` and ``lstrip_blocks``, the loop controls, the ``{% generation %}`` tag (rendered
as its body), ``tojson`` without HTML escaping, ``raise_exception`` and ``strftime_now``; the
named special tokens are passed to the template as variables. ``tests/dataset/test_direct_tokenizer.py``
checks the texts, ids and offsets against transformers, template by template.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

# transformers' named special tokens (SPECIAL_TOKENS_ATTRIBUTES), passed to the chat template.
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
LEGACY_FILES = ("special_tokens_map.json", "added_tokens.json")


class NotDirect(Exception):
    """The model's tokenizer files need transformers' own loading; the message says which premise fails."""


def read_json_object(path: Path) -> dict:
    """The JSON object in ``path``; {} when the file is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _content(token: Any) -> str | None:
    """A special token's text, as the config writes it (a string or an AddedToken's dict)."""
    if isinstance(token, str):
        return token
    if isinstance(token, Mapping) and isinstance(token.get("content"), str):
        return token["content"]
    return None


def _chat_template(model_dir: Path, config: dict) -> str:
    if (model_dir / "additional_chat_templates").is_dir():
        raise NotDirect("the model has named chat templates (additional_chat_templates/)")
    file = model_dir / "chat_template.jinja"
    if file.is_file():
        return file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template or ""
    raise NotDirect("tokenizer_config.json has named chat templates")


def _check_added(config: dict, added: dict[str, int]) -> None:
    """NotDirect unless every added token the config lists is tokenizer.json's, with the same id."""
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, Mapping):
        raise NotDirect("tokenizer_config.json's added_tokens_decoder is not a mapping")
    for index, token in decoder.items():
        text = _content(token)
        if text is None or added.get(text) != int(index):
            raise NotDirect(f"added token {index} ({text!r}) of tokenizer_config.json is not tokenizer.json's")
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    if not isinstance(extra, list) or config.get("model_specific_special_tokens"):
        raise NotDirect("tokenizer_config.json names model-specific special tokens")
    for token in extra:
        if _content(token) not in added:
            raise NotDirect(f"extra special token {token!r} is not an added token of tokenizer.json")


def _special_tokens(config: dict, added: dict[str, int]) -> dict[str, str]:
    """The named special tokens the template sees; NotDirect unless every configured token is added."""
    _check_added(config, added)
    named = {}
    for attr in NAMED_SPECIAL_TOKENS:
        if config.get(attr) is None:
            continue
        text = _content(config[attr])
        if text is None or text not in added:
            raise NotDirect(f"special token {attr} ({config[attr]!r}) is not an added token of tokenizer.json")
        named[attr] = text
    return named


class DirectTokenizer:
    """What the client asks of a tokenizer (call with offsets, ``len``, the chat template), on the
    ``tokenizers`` backend; see the module docstring for why it equals transformers' here."""

    is_fast = True

    def __init__(self, backend: Any, chat_template: str, special_tokens_map: dict[str, str]):
        self._backend = backend
        self.chat_template = chat_template
        self.special_tokens_map = special_tokens_map
        self._compiled: tuple[str, Any] | None = None

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def __call__(
        self, text: str, add_special_tokens: bool = True, return_offsets_mapping: bool = False
    ) -> dict[str, list]:
        enc = self._backend.encode(text, add_special_tokens=add_special_tokens)
        out: dict[str, list] = {"input_ids": enc.ids}  # (no attention mask: nothing here reads one)
        if return_offsets_mapping:
            out["offset_mapping"] = enc.offsets
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens included (transformers' ``decode`` without clean-up)."""
        return self._backend.decode(list(ids), skip_special_tokens=False)

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, Any]],
        tools: Sequence[dict] | None = None,
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str | dict[str, list]:
        """The conversation rendered as text, or with ``tokenize=True`` its tokens as transformers 5
        returns them (a dict, special tokens not added: the template writes them)."""
        text = self._render(conversation, tools, add_generation_prompt, kwargs)
        return self(text, add_special_tokens=False) if tokenize else text

    def _render(
        self,
        conversation: Sequence[Mapping[str, Any]],
        tools: Sequence[dict] | None,
        add_generation_prompt: bool,
        kwargs: dict[str, Any],
    ) -> str:
        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        if not self.chat_template:
            raise ValueError("the tokenizer has no chat template")
        return self._template().render(
            messages=list(conversation),
            tools=list(tools) if tools is not None else None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens_map, **kwargs},
        )

    def _template(self) -> Any:
        if self._compiled is None or self._compiled[0] != self.chat_template:
            self._compiled = (self.chat_template, compile_template(self.chat_template))
        return self._compiled[1]


def compile_template(source: str) -> Any:
    """The chat template compiled as transformers compiles it (see the module docstring)."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}``: transformers' assistant-mask tag, rendered as its body."""

        tags = {"generation"}  # noqa: RUF012 - jinja2 declares it on Extension so

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def load_direct(model_dir: Path) -> DirectTokenizer:
    """The model's generic fast tokenizer without transformers; NotDirect when a premise fails."""
    from tokenizers import Tokenizer

    config = read_json_object(model_dir / "tokenizer_config.json")
    if "added_tokens_decoder" not in config and any((model_dir / name).exists() for name in LEGACY_FILES):
        raise NotDirect("transformers merges the legacy special_tokens_map.json / added_tokens.json")
    if config.get("split_special_tokens"):
        raise NotDirect("the tokenizer splits special tokens")
    template = _chat_template(model_dir, config)
    try:
        backend = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    except Exception as exc:  # the tokenizers library raises its own Exception type
        raise NotDirect(f"tokenizer.json does not load ({exc})") from exc
    if backend.post_processor is None and (config.get("add_bos_token") or config.get("add_eos_token")):
        raise NotDirect("transformers builds the post-processor (add_bos_token / add_eos_token)")
    # What a call of transformers' tokenizer without truncation or padding does to the backend.
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = False
    added = {t.content: i for i, t in backend.get_added_tokens_decoder().items()}
    return DirectTokenizer(backend, template, _special_tokens(config, added))
