"""Read a JSONL conversation dataset line by line into samples or rejects, never stopping on bad input.

A dataset for days of extraction is large, hand-assembled and dirty: a truncated last line, a
non-UTF-8 byte, a conversation with an empty turn, the same sample twice. None of these may stop
the run, and none may vanish silently: every line becomes exactly one `Sample` or one `Reject`
(with a stable reason code), so "accepted + rejected == lines" holds and the rejects file can be
read by the person who built the dataset.

The stable index of a sample is its 0-based line number: blank lines count, so the index of a
line never depends on what came before it, and a rid made from it survives restarts and
edits elsewhere in the file (appending lines keeps every existing index).

Accepted shapes, one JSON object per line:

* ShareGPT:  ``{"conversations": [{"from": "human"|"gpt"|"system", "value": "..."}], "system"?: "..."}``
* OpenAI:    ``{"messages": [{"role": "user"|"assistant"|"system", "content": "..."}]}``, content may
  also be a list of ``{"type": "text", "text": "..."}`` parts
* tokenized: ``{"input_ids": [int, ...], "loss_mask"?: [0|1, ...]}`` (no mask: every token is trained on)

This module is pure (no tokenizer, no I/O beyond the byte lines it is given), so property tests
can feed it arbitrary bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from hsextract.errors import HsextractError

# Role names as they appear in the wild, mapped to the chat-template roles.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "system": "system",
}
OPENAI_ROLES = {"user": "user", "assistant": "assistant", "system": "system"}

# Reject reason codes (stable: they are counted in the summary and grepped in rejects files).
BLANK_LINE = "blank_line"
NOT_UTF8 = "not_utf8"
MALFORMED_JSON = "malformed_json"
NOT_AN_OBJECT = "not_an_object"
UNKNOWN_SHAPE = "unknown_shape"
EMPTY_CONVERSATION = "empty_conversation"
BAD_MESSAGE = "bad_message"
UNKNOWN_ROLE = "unknown_role"
EMPTY_CONTENT = "empty_content"
NO_ASSISTANT_TURN = "no_assistant_turn"
BAD_INPUT_IDS = "bad_input_ids"
BAD_LOSS_MASK = "bad_loss_mask"
DUPLICATE = "duplicate"


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass
class Sample:
    """A line that parsed into a usable sample; not yet tokenized (unless it came tokenized)."""

    index: int  # 0-based line number: the stable identity of the sample
    messages: list[Message] | None = None
    input_ids: list[int] | None = None
    loss_mask: list[int] | None = None

    @property
    def line(self) -> int:
        return self.index + 1

    @property
    def is_tokenized(self) -> bool:
        return self.input_ids is not None


@dataclass
class Reject:
    """A line that cannot become a sample, with the reason in words a dataset author can act on."""

    index: int
    reason: str
    detail: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def line(self) -> int:
        return self.index + 1

    def to_json(self) -> dict:
        return {"line": self.line, "index": self.index, "reason": self.reason, "detail": self.detail, **self.extra}


class _BadLine(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _content_text(content: object, where: str) -> str:
    """The text of a message's content: a string, or OpenAI's list of text parts joined."""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise _BadLine(BAD_MESSAGE, f"{where}: content part {str(part)[:60]!r} is not a text part")
        text = "".join(parts)
    elif content is None:
        raise _BadLine(EMPTY_CONTENT, f"{where}: content is missing")
    else:
        raise _BadLine(BAD_MESSAGE, f"{where}: content is a {type(content).__name__}, expected a string")
    if not text.strip():
        raise _BadLine(EMPTY_CONTENT, f"{where}: content is empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _BadLine(NOT_UTF8, f"{where}: content has a lone surrogate escape (\\ud800-\\udfff)") from None
    return text


def _messages(turns: object, key: str, role_key: str, text_key: str, roles: dict[str, str]) -> list[Message]:
    if not isinstance(turns, list):
        raise _BadLine(UNKNOWN_SHAPE, f"'{key}' is a {type(turns).__name__}, expected a list of turns")
    if not turns:
        raise _BadLine(EMPTY_CONVERSATION, f"'{key}' is empty")
    out = []
    for i, turn in enumerate(turns):
        where = f"{key}[{i}]"
        if not isinstance(turn, dict):
            raise _BadLine(BAD_MESSAGE, f"{where} is a {type(turn).__name__}, expected an object")
        role = turn.get(role_key)
        if not isinstance(role, str) or not role:
            raise _BadLine(BAD_MESSAGE, f"{where} has no '{role_key}'")
        mapped = roles.get(role.strip().lower())
        if mapped is None:
            raise _BadLine(UNKNOWN_ROLE, f"{where}: role {role[:40]!r}; expected one of {', '.join(sorted(roles))}")
        out.append(Message(mapped, _content_text(turn.get(text_key), where)))
    if not any(m.role == "assistant" for m in out):
        raise _BadLine(NO_ASSISTANT_TURN, f"'{key}' has no assistant turn, so no token would be trained on")
    return out


def _int_list(value: object, key: str, reason: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise _BadLine(reason, f"'{key}' must be a non-empty list of integers")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _BadLine(reason, f"'{key}'[{i}] is {str(v)[:40]!r}, not an integer")
    return value


def parse_object(index: int, obj: object) -> Sample:
    """Turn one decoded JSON value into a Sample, or raise _BadLine saying why it cannot be one."""
    if not isinstance(obj, dict):
        raise _BadLine(NOT_AN_OBJECT, f"a JSON {type(obj).__name__}, expected an object")
    if "input_ids" in obj:
        ids = _int_list(obj["input_ids"], "input_ids", BAD_INPUT_IDS)
        if any(v < 0 for v in ids):
            raise _BadLine(BAD_INPUT_IDS, "'input_ids' has negative token ids")
        mask = obj.get("loss_mask")
        if mask is None:
            mask = [1] * len(ids)
        else:
            if isinstance(mask, list):
                mask = [int(v) if isinstance(v, bool) else v for v in mask]
            mask = _int_list(mask, "loss_mask", BAD_LOSS_MASK)
            if len(mask) != len(ids):
                raise _BadLine(BAD_LOSS_MASK, f"'loss_mask' has {len(mask)} values for {len(ids)} input ids")
            if any(v not in (0, 1) for v in mask):
                raise _BadLine(BAD_LOSS_MASK, "'loss_mask' values must be 0 or 1")
        if not any(mask):
            raise _BadLine(BAD_LOSS_MASK, "'loss_mask' is all zeros, so no token would be trained on")
        return Sample(index, input_ids=ids, loss_mask=mask)
    if "conversations" in obj:
        msgs = _messages(obj["conversations"], "conversations", "from", "value", SHAREGPT_ROLES)
        system = obj.get("system")
        if isinstance(system, str) and system.strip() and msgs[0].role != "system":
            msgs.insert(0, Message("system", system))
        return Sample(index, messages=msgs)
    if "messages" in obj:
        return Sample(index, messages=_messages(obj["messages"], "messages", "role", "content", OPENAI_ROLES))
    keys = ", ".join(sorted(map(str, obj))[:8]) or "none"
    raise _BadLine(UNKNOWN_SHAPE, f"no 'conversations', 'messages' or 'input_ids' key (keys: {keys})")


def parse_line(index: int, raw: bytes) -> Sample | Reject:
    """Parse one line (without its newline) into a Sample or a Reject; never raises."""
    try:
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw.strip():
            return Reject(index, BLANK_LINE, "blank line")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Reject(index, NOT_UTF8, f"byte {exc.start} is not UTF-8 ({raw[exc.start:exc.start + 4]!r})")
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError) as exc:
            return Reject(index, MALFORMED_JSON, str(exc)[:200])
        return parse_object(index, obj)
    except _BadLine as bad:
        return Reject(index, bad.reason, bad.detail)
    except RecursionError:
        return Reject(index, MALFORMED_JSON, "nested too deeply")


def sample_key(sample: Sample) -> int:
    """A digest of what the model would see, so the same sample written twice is caught."""
    if sample.is_tokenized:
        payload = json.dumps([sample.input_ids, sample.loss_mask], separators=(",", ":"))
    else:
        payload = json.dumps([[m.role, m.content] for m in sample.messages or []], separators=(",", ":"))
    # 8 bytes as an int: ~100 bytes of memory per sample in the reader's table; collisions are
    # ~1e-6 likely at 1e7 samples
    return int.from_bytes(hashlib.blake2b(payload.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


class DatasetReader:
    """Turns a stream of byte lines into Samples and Rejects, rejecting repeats of earlier samples.

    The first occurrence of a sample wins, judged over the whole file, so every shard of a
    multi-host run agrees on which copy is the duplicate: read every line even when only one
    shard's samples are used.
    """

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}

    def feed(self, index: int, raw: bytes) -> Sample | Reject:
        item = parse_line(index, raw)
        if isinstance(item, Sample):
            key = sample_key(item)
            first = self._seen.setdefault(key, index)
            if first != index:
                return Reject(index, DUPLICATE, f"same sample as line {first + 1}")
        return item

    def read_lines(self, lines: Iterable[bytes]) -> Iterator[Sample | Reject]:
        for index, raw in enumerate(lines):
            yield self.feed(index, raw)


def read_dataset(path: str | Path) -> Iterator[Sample | Reject]:
    """Every row of the dataset at `path`, in index order, as a Sample or a Reject (duplicates rejected).

    The one way to go through a dataset: the client sends what this yields and ``hsextract plan``
    sizes it, so both always see the same samples with the same indices. Opens the file at once,
    so a missing dataset fails here.
    """
    return DatasetReader().read_lines(iter_file_lines(path))


def open_dataset(path: str | Path) -> BinaryIO:
    """Open a dataset file for reading; HsextractError saying what to pass when it cannot be."""
    p = Path(path)
    try:
        return p.open("rb")
    except FileNotFoundError:
        raise HsextractError(f"dataset {p} does not exist; pass --dataset with a JSONL file") from None
    except IsADirectoryError:
        raise HsextractError(f"dataset {p} is a directory; pass --dataset with a JSONL file") from None
    except OSError as exc:
        raise HsextractError(f"dataset {p}: cannot open ({exc})") from exc


def iter_file_lines(path: str | Path) -> Iterator[bytes]:
    """The lines of a file as bytes, without their newlines; a last line without newline counts.

    The file is opened at once (not at the first line), so a missing dataset fails here.
    """
    return _lines(open_dataset(path))


def _lines(f: BinaryIO) -> Iterator[bytes]:
    with f:
        for line in f:
            yield line[:-1] if line.endswith(b"\n") else line


def count_lines(path: str | Path) -> int:
    """Number of lines `iter_file_lines` will yield (for progress and ETA), read in 1 MiB blocks."""
    n = 0
    last = b"\n"
    with open_dataset(path) as f:
        while block := f.read(1 << 20):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (0 if last == b"\n" else 1)
