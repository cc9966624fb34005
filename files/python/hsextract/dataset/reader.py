"""Read a conversation dataset row by row into samples or rejects, never stopping on bad input.

A dataset for days of extraction is large, hand-assembled and dirty: a truncated last line, a
non-UTF-8 byte, a conversation with an empty turn, the same sample twice, a corrupt shard. None of
these may stop the run, and none may vanish silently: every row becomes exactly one `Sample` or
one `Reject` (with a stable reason code, the file and the row), so "accepted + rejected == rows"
holds and the rejects file can be read by the person who built the dataset.

`read_dataset(path)` is the one way to iterate the samples of a dataset path (a file or a
directory of JSONL, JSON arrays, Parquet, Arrow, compressed or not: see `sources`), and
`count_rows(path)` says how many rows it will yield. The stable index of a sample is its
position in that stream: the files in sorted order, then the row in the file (for JSONL the
line, blank lines included), so it never depends on what the rows contain, and appending rows
to the last file keeps every existing index.

Accepted shapes of a row:

* ShareGPT:  ``{"conversations": [{"from": "human"|"gpt"|"system"|"tool", "value": "..."}], "system"?: "..."}``
* OpenAI:    ``{"messages": [{"role": "user"|"assistant"|"system"|"tool", "content": "...", ...}], "tools"?: [...]}``
  with ``tool_calls``, ``tool_call_id`` and reasoning (see `conversation`); content may also be a
  list of ``{"type": "text", "text": "..."}`` parts
* tokenized: ``{"input_ids": [int, ...], "loss_mask"?: [0|1, ...]}`` (no mask: every token is trained on)

A row may carry an ``id`` (kept on the sample). Parsing is pure, so property tests can feed it
arbitrary bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hsextract.dataset import defaults
from hsextract.dataset.conversation import (
    BAD_MESSAGE,
    BAD_TOOL_CALL,
    BAD_TOOLS,
    EMPTY_CONTENT,
    EMPTY_CONVERSATION,
    NO_ASSISTANT_TURN,
    NOT_UTF8,
    OPENAI_ROLES,
    SHAREGPT_ROLES,
    TOOL_WITHOUT_CALL,
    UNKNOWN_ROLE,
    UNKNOWN_SHAPE,
    BadConversation,
    Conversation,
    Message,
    ToolCall,
    parse_conversation,
)
from hsextract.dataset.sources import BOM, UNREADABLE_FILE, Row, Unreadable, count_rows, dataset_files, file_rows
from hsextract.errors import ConfigError
from hsextract.options import Option

# Reject reason codes (stable: they are counted in the summary and grepped in rejects files); the
# conversation's own are in `hsextract.dataset.conversation`.
BLANK_LINE = "blank_line"
MALFORMED_JSON = "malformed_json"
NOT_AN_OBJECT = "not_an_object"
BAD_INPUT_IDS = "bad_input_ids"
BAD_LOSS_MASK = "bad_loss_mask"
DUPLICATE = "duplicate"
ROW_TOO_LARGE = "row_too_large"

__all__ = [
    "BAD_INPUT_IDS",
    "BAD_LOSS_MASK",
    "BAD_MESSAGE",
    "BAD_TOOLS",
    "BAD_TOOL_CALL",
    "BLANK_LINE",
    "DUPLICATE",
    "EMPTY_CONTENT",
    "EMPTY_CONVERSATION",
    "MALFORMED_JSON",
    "MAX_ROW_BYTES_OPTION",
    "NOT_AN_OBJECT",
    "NOT_UTF8",
    "NO_ASSISTANT_TURN",
    "OPENAI_ROLES",
    "ROW_TOO_LARGE",
    "SHAREGPT_ROLES",
    "TOOL_WITHOUT_CALL",
    "UNKNOWN_ROLE",
    "UNKNOWN_SHAPE",
    "UNREADABLE_FILE",
    "Conversation",
    "DatasetReader",
    "Message",
    "Reject",
    "Sample",
    "ToolCall",
    "count_rows",
    "dataset_files",
    "parse_line",
    "parse_object",
    "parse_row",
    "read_dataset",
]


@dataclass
class Sample:
    """A row that parsed into a usable sample; not yet tokenized (unless it came tokenized)."""

    index: int  # position in the dataset (file order, then row): the stable identity of the sample
    messages: list[Message] | None = None
    input_ids: list[int] | None = None
    loss_mask: list[int] | None = None
    tools: tuple[dict, ...] | None = None
    id: str | None = None  # the row's own id, when it has one
    file: str = ""  # the dataset file it came from, relative to the dataset path
    row: int | None = None  # its 0-based row in that file (None: the index)

    @property
    def line(self) -> int:
        """1-based row in its file: the line number of a JSONL file."""
        return (self.index if self.row is None else self.row) + 1

    @property
    def source(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def is_tokenized(self) -> bool:
        return self.input_ids is not None

    def conversation(self) -> Conversation:
        return Conversation(tuple(self.messages or ()), self.tools, self.id)


@dataclass
class Reject:
    """A row that cannot become a sample, with the reason in words a dataset author can act on."""

    index: int
    reason: str
    detail: str = ""
    extra: dict = field(default_factory=dict)
    file: str = ""
    row: int | None = None

    @property
    def line(self) -> int:
        return (self.index if self.row is None else self.row) + 1

    def to_json(self) -> dict:
        out = {"line": self.line, "index": self.index, "reason": self.reason, "detail": self.detail}
        if self.file:
            out["file"] = self.file
        return {**out, **self.extra}


class _BadRow(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _int_list(value: object, key: str, reason: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise _BadRow(reason, f"'{key}' must be a non-empty list of integers")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _BadRow(reason, f"'{key}'[{i}] is {str(v)[:40]!r}, not an integer")
    return value


def _tokenized(index: int, obj: Mapping) -> Sample:
    ids = _int_list(obj["input_ids"], "input_ids", BAD_INPUT_IDS)
    if any(v < 0 for v in ids):
        raise _BadRow(BAD_INPUT_IDS, "'input_ids' has negative token ids")
    mask = obj.get("loss_mask")
    if mask is None:
        mask = [1] * len(ids)
    else:
        if isinstance(mask, list):
            mask = [int(v) if isinstance(v, bool) else v for v in mask]
        mask = _int_list(mask, "loss_mask", BAD_LOSS_MASK)
        if len(mask) != len(ids):
            raise _BadRow(BAD_LOSS_MASK, f"'loss_mask' has {len(mask)} values for {len(ids)} input ids")
        if any(v not in (0, 1) for v in mask):
            raise _BadRow(BAD_LOSS_MASK, "'loss_mask' values must be 0 or 1")
    if not any(mask):
        raise _BadRow(BAD_LOSS_MASK, "'loss_mask' is all zeros, so no token would be trained on")
    return Sample(index, input_ids=list(ids), loss_mask=mask)


def parse_object(index: int, obj: object, require_assistant: bool = True) -> Sample:
    """Turn one decoded row into a Sample, or raise _BadRow / BadConversation saying why it cannot be one.

    `require_assistant=False` accepts conversations without a reply (prompts for the regenerator).
    """
    if not isinstance(obj, Mapping):
        raise _BadRow(NOT_AN_OBJECT, f"a JSON {type(obj).__name__}, expected an object")
    if obj.get("input_ids") is not None:
        return _tokenized(index, obj)
    conv = parse_conversation(obj, require_assistant)
    return Sample(index, messages=list(conv.messages), tools=conv.tools, id=conv.id)


def _decode(raw: bytes) -> object:
    """A JSON text's value; _BadRow for blank, non-UTF-8 or malformed text."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if raw.startswith(BOM):  # a file's (or a concatenated file's) byte-order mark
        raw = raw[len(BOM) :]
    if not raw.strip():
        raise _BadRow(BLANK_LINE, "blank line")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _BadRow(NOT_UTF8, f"byte {exc.start} is not UTF-8 ({raw[exc.start : exc.start + 4]!r})") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _BadRow(MALFORMED_JSON, str(exc)[:200]) from None


def _parse(index: int, data: bytes | Mapping | Unreadable, require_assistant: bool = True) -> Sample | Reject:
    try:
        if isinstance(data, Unreadable):
            return Reject(index, data.reason, data.detail)
        obj = _decode(data) if isinstance(data, (bytes, bytearray)) else data
        return parse_object(index, obj, require_assistant)
    except (_BadRow, BadConversation) as bad:
        return Reject(index, bad.reason, bad.detail)
    except RecursionError:
        return Reject(index, MALFORMED_JSON, "nested too deeply")


def parse_line(index: int, raw: bytes) -> Sample | Reject:
    """Parse one JSONL line (without its newline) into a Sample or a Reject; never raises."""
    return _parse(index, raw)


def parse_row(index: int, row: Row, require_assistant: bool = True) -> Sample | Reject:
    """Parse one dataset row into a Sample or a Reject naming its file and row; never raises."""
    item = _parse(index, row.data, require_assistant)
    item.file, item.row = row.file, row.row
    return item


def sample_key(sample: Sample) -> int:
    """A digest of what the model would see, so the same sample written twice is caught."""
    if sample.is_tokenized:
        payload = json.dumps([sample.input_ids, sample.loss_mask], separators=(",", ":"))
    else:
        conv = sample.conversation().to_openai()
        conv.pop("id", None)  # the same conversation under another id is still the same sample
        payload = json.dumps(conv, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    # 8 bytes as an int: ~100 bytes of memory per sample in the reader's table; collisions are
    # ~1e-6 likely at 1e7 samples
    return int.from_bytes(hashlib.blake2b(payload.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def row_size(data: bytes | Mapping | Unreadable, limit: int) -> int:
    """The size a row is judged by: a JSON text's bytes, a table row's characters of text (counted
    until they pass `limit`, so a huge row costs no more than the count)."""
    if isinstance(data, (bytes, bytearray)):
        return len(data)
    if isinstance(data, Unreadable):
        return 0
    total = 0
    stack: list[object] = [data]
    while stack and total <= limit:
        value = stack.pop()
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return total


class DatasetReader:
    """Turns rows into Samples and Rejects, rejecting repeats of earlier samples and rows too large to tokenize.

    The first occurrence of a sample wins, judged over the whole dataset, so every shard of a
    multi-host run agrees on which copy is the duplicate: read every row even when only one
    shard's samples are used.

    A row over `max_row_bytes` is rejected (`ROW_TOO_LARGE`) before it is parsed: rendering and
    tokenizing it with offsets would cost a few hundred bytes of memory per byte of it (one 50 MB
    line took 17 GB in each of plan's workers), and no context holds it anyway.
    """

    def __init__(
        self, dedupe: bool = True, require_assistant: bool = True, max_row_bytes: int = defaults.MAX_ROW_BYTES
    ) -> None:
        if max_row_bytes < 1:
            raise ConfigError(f"--max-row-bytes {max_row_bytes}: must be at least 1")
        self.dedupe = dedupe
        self.require_assistant = require_assistant
        self.max_row_bytes = max_row_bytes
        self._seen: dict[int, tuple[int, str]] = {}

    def _dedupe(self, item: Sample | Reject) -> Sample | Reject:
        if isinstance(item, Sample) and self.dedupe:
            first, where = self._seen.setdefault(sample_key(item), (item.index, item.source))
            if first != item.index:
                return Reject(item.index, DUPLICATE, f"same sample as {where}", file=item.file, row=item.row)
        return item

    def _too_large(self, index: int, data: bytes | Mapping | Unreadable) -> Reject | None:
        size = row_size(data, self.max_row_bytes)
        if size <= self.max_row_bytes:
            return None
        unit = "bytes" if isinstance(data, (bytes, bytearray)) else "characters of text"
        detail = (
            f"the row has {size:,} {unit}{'' if unit == 'bytes' else ' or more'}, more than --max-row-bytes "
            f"{self.max_row_bytes:,}; raise --max-row-bytes to read it"
        )
        return Reject(index, ROW_TOO_LARGE, detail, {"size": size, "max_row_bytes": self.max_row_bytes})

    def feed(self, index: int, raw: bytes) -> Sample | Reject:
        """A JSONL line (index = its 0-based line number)."""
        item = self._too_large(index, raw) or parse_line(index, raw)
        if isinstance(item, Sample) and self.dedupe:
            first, _ = self._seen.setdefault(sample_key(item), (index, ""))
            if first != index:
                return Reject(index, DUPLICATE, f"same sample as line {first + 1}")
        return item

    def feed_row(self, index: int, row: Row) -> Sample | Reject:
        too_large = self._too_large(index, row.data)
        if too_large is not None:
            too_large.file, too_large.row = row.file, row.row
            return too_large
        return self._dedupe(parse_row(index, row, self.require_assistant))

    def read_lines(self, lines: Iterable[bytes]) -> Iterator[Sample | Reject]:
        for index, raw in enumerate(lines):
            yield self.feed(index, raw)


# ``--max-row-bytes``: the bound of `DatasetReader`, a flag of every command that reads a dataset
# (its settings' field: ``option(defaults.MAX_ROW_BYTES, like=MAX_ROW_BYTES_OPTION)``).
MAX_ROW_BYTES_OPTION = Option(
    type=int,
    metavar="N",
    help=f"reject rows larger than N bytes (a table row: characters) before tokenizing them "
    f"(reason {ROW_TOO_LARGE}; default {defaults.MAX_ROW_BYTES:,})",
)


def read_dataset(path: str | Path, reader: DatasetReader | None = None) -> Iterator[Sample | Reject]:
    """Every row of the dataset at `path` as a Sample or a Reject, indexed in file order then row order.

    The one entry point for reading a dataset: the extraction client, the regenerator and the
    planner all read through it, so they agree on every index and every reject. A missing or
    unusable path raises HsextractError at once (before the first row is asked for).
    """
    files = dataset_files(path)
    reader = reader or DatasetReader()

    def rows() -> Iterator[Sample | Reject]:
        index = 0
        for f in files:
            for row in file_rows(f):
                yield reader.feed_row(index, row)
                index += 1

    return rows()
