"""A JSON array read element by element, from blocks of bytes, never whole.

ShareGPT's original files are JSON arrays of GBs. The scan finds each element's bounds by its
brackets and strings only (a whole string is skipped by one regular-expression match, in C) and
hands the element's own bytes on, to be parsed as one row; only the element being read and the
block it is in are held in memory. An element is whatever lies between two commas at the
array's own level, so a malformed element is one bad row and the next one is read: a closing
bracket that matches no opener of the element is ignored, and one that skips openers closes
them, so an element with a missing bracket still ends where it should.

What is no element (a blank one, a file that is no array, data after its end, an array never
closed) comes out as `NotAnElement`, with the reason code the dataset reader rejects it with.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

# Reasons of what is no element (stable: the client's rejects carry them).
MALFORMED_JSON = "malformed_json"
BLANK = "blank_line"


@dataclass(frozen=True)
class NotAnElement:
    """A part of the file that is no element of the array, and why."""

    reason: str  # MALFORMED_JSON or BLANK
    detail: str


# One JSON string whole (skipped in C), a quote whose string goes on past the buffer, or a bracket/comma.
_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+"|"|[\[\]{},]', re.DOTALL)


class ArrayScan:
    """Where the scan of one JSON array stands between the blocks appended to it."""

    def __init__(self, name: str):
        self.name = name
        self.buf = bytearray()
        self.start = 0  # where the current element begins in buf
        self.pos = 0  # scan position in buf
        self.closers: list[bytes] = []  # what the current element still has to close, innermost last
        self.state = "before"  # before the '[', inside the array, after its ']', or ended by bad data
        self.commas = 0

    @property
    def ended(self) -> bool:
        """Bad data ended the scan: the rest of the file is not read."""
        return self.state == "ended"

    def append(self, block: bytes) -> None:
        del self.buf[: self.start]  # drop the elements already yielded, once per block
        self.pos -= self.start
        self.start = 0
        self.buf += block

    def scan(self) -> Iterator[bytes | NotAnElement]:
        """The elements (and bad rows) the buffer completes."""
        if self.state == "before":
            yield from self._open()
        if self.state == "after":
            yield from self._after_end()
        elif self.state == "inside":
            yield from self._elements()

    def finish(self) -> Iterator[bytes | NotAnElement]:
        """At the end of the file: an array that was never closed."""
        if self.state != "inside":
            return
        rest = bytes(self.buf[self.start :])
        unterminated_string = self.pos < len(self.buf)  # the scan stopped at a quote whose string never ends
        if rest.strip() and not self.closers and not unterminated_string:
            yield rest  # a whole last element: only the array's end is missing
        yield NotAnElement(MALFORMED_JSON, f"{self.name}: the JSON array is not closed (is the file truncated?)")

    def _open(self) -> Iterator[NotAnElement]:
        stripped = bytes(self.buf).lstrip()
        if not stripped:
            self.buf.clear()
            self.pos = 0
            return
        if not stripped.startswith(b"["):
            self.state = "ended"
            yield NotAnElement(MALFORMED_JSON, f"{self.name}: not a JSON array (starts with {stripped[:20]!r})")
            return
        self.start = self.pos = len(self.buf) - len(stripped) + 1
        self.state = "inside"

    def _after_end(self) -> Iterator[NotAnElement]:
        """Past the array's ']' only blanks may follow."""
        if bytes(self.buf[self.start :]).strip():
            self.state = "ended"
            yield NotAnElement(MALFORMED_JSON, f"{self.name}: data after the end of the JSON array")
            return
        self.buf.clear()
        self.start = self.pos = 0

    def _elements(self) -> Iterator[bytes | NotAnElement]:
        buf, closers = self.buf, self.closers
        while True:
            m = _TOKEN.search(buf, self.pos)
            if m is None:
                self.pos = len(buf)
                return
            c = m.group()
            if c[:1] == b'"':
                # a whole string is skipped; a lone quote is one whose string ends in a later block
                self.pos = m.start() if len(c) == 1 else m.end()
                if len(c) == 1:
                    return
                continue
            self.pos = m.end()
            if c in b"[{":
                closers.append(b"]" if c == b"[" else b"}")
            elif closers and c in b"]}":
                _close(closers, c)
            elif not closers and c in b",]":
                yield from self._end_element(m.start(), c)
                if self.state != "inside":
                    return

    def _end_element(self, end: int, c: bytes) -> Iterator[bytes | NotAnElement]:
        element = bytes(self.buf[self.start : end])
        self.start = self.pos
        if c == b"]":
            self.state = "after"
        else:
            self.commas += 1
        if element.strip():
            yield element
        elif c == b"," or self.commas:  # "[]" is an empty array, "[1,]" has an empty element
            yield NotAnElement(BLANK, f"{self.name}: empty array element")
        if self.state == "after":
            yield from self._after_end()


def _close(closers: list[bytes], c: bytes) -> None:
    """A closer that does not match (a broken element) closes up to the opener it matches, so the
    element ends at the next comma of the array's own level, not at the file's end."""
    if c in closers:
        while closers.pop() != c:
            pass
