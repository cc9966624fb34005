"""The manifest of a set in a bucket: immutable numbered segments, each created once.

::

    <prefix>/manifest.json                        the header (hsextract.output.manifest), created once
    <prefix>/.hsextract/run.json                  the run id, created once
    <prefix>/.hsextract/segments/000000000.jsonl  segment 0, 1, 2...: a head line, then manifest lines

A segment is created with ``If-None-Match: *``, so of two writers only one can publish segment N
(the server proved it honours that: hsextract.objectstore.check). The set is the segments'
manifest lines in order; a sample is in the set exactly when a segment names it, and its object
was confirmed (size and checksum) before the segment was published.

Each drain starts by publishing an *epoch* segment, a head line and no sample: it names the drain
(its writer id) and fences every earlier writer of the prefix, whose next publish now meets a taken
number and stops it (`SegmentTaken`), with its samples still staged. So a drain that died mid-run
is taken over by the next one without any lock, and two drains never both add samples from the
same segment number on. An epoch's number is its segment's; every sample object carries its
writer's epoch (hsextract.objectstore.committer), and a writer may replace only an object of an
earlier epoch, which no segment can name any more.
"""

from __future__ import annotations

import json
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from hsextract.errors import HsextractError
from hsextract.objectstore.store import KeyExists, ObjectStore
from hsextract.output.manifest import ManifestEntry, ManifestError

SEGMENTS_DIR = ".hsextract/segments"
RUN_KEY = ".hsextract/run.json"
HEADER_KEY = "manifest.json"
_SEGMENT_RE = re.compile(r"(\d{9})\.jsonl")


class SegmentTaken(HsextractError):
    """Another writer published the segment number this one meant to: it must stop."""

    exit_code = 5


def segment_rel(n: int) -> str:
    return f"{SEGMENTS_DIR}/{n:09d}.jsonl"


@dataclass
class SegmentHead:
    """A segment's first line: who published it, when, and of which kind."""

    segment: int
    kind: str  # "epoch" (a writer's start) or "samples"
    writer: str  # the writer's id: host, pid, random token
    epoch: int  # the number of the writer's epoch segment
    created_at: float = 0.0

    def line(self) -> bytes:
        return (json.dumps(asdict(self), separators=(",", ":")) + "\n").encode()


@dataclass
class Published:
    """What the bucket's segments hold."""

    entries: list[ManifestEntry]
    heads: list[SegmentHead]

    @property
    def next_segment(self) -> int:
        return len(self.heads)


def new_writer_id() -> str:
    import os
    import secrets

    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def parse_segment(data: bytes, where: str) -> tuple[SegmentHead, list[ManifestEntry]]:
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    try:
        head = SegmentHead(**json.loads(lines[0]))
        entries = [ManifestEntry.from_dict(json.loads(line)) for line in lines[1:] if line.strip()]
    except (ValueError, TypeError, IndexError) as exc:
        raise ManifestError(
            f"{where}: not a manifest segment ({exc}); segments are never rewritten, so it was "
            "damaged or written by something else"
        ) from None
    return head, entries


def read_published(store: ObjectStore, threads: int = 16) -> Published:
    """Every segment of the set, in order: ManifestError on a gap in the numbers or a damaged one."""
    numbers = []
    for info in store.list_objects(SEGMENTS_DIR + "/"):
        m = _SEGMENT_RE.fullmatch(info.key.rsplit("/", 1)[-1])
        if m:
            numbers.append(int(m.group(1)))
    numbers.sort()
    if numbers != list(range(len(numbers))):
        missing = sorted(set(range(max(numbers, default=-1) + 1)) - set(numbers))
        raise ManifestError(
            f"{store.url}/{SEGMENTS_DIR}: segment(s) {missing[:5]} missing of {len(numbers)}; "
            "segments are never deleted by hsextract: restore them"
        )

    def fetch(n: int) -> tuple[SegmentHead, list[ManifestEntry]]:
        key = store.url.key(segment_rel(n))
        data = store.get_bytes(key)
        if data is None:
            raise ManifestError(f"{store.url}/{segment_rel(n)}: listed, then gone")
        return parse_segment(data, f"{store.url}/{segment_rel(n)}")

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(numbers)))) as pool:
        parsed = list(pool.map(fetch, numbers))
    entries: list[ManifestEntry] = []
    heads: list[SegmentHead] = []
    for n, (head, rows) in zip(numbers, parsed, strict=True):
        if head.segment != n:
            raise ManifestError(f"{store.url}/{segment_rel(n)}: its head says segment {head.segment}")
        heads.append(head)
        for e in rows:
            if e.output_index != len(entries):
                raise ManifestError(
                    f"{store.url}/{segment_rel(n)}: names output index {e.output_index} where {len(entries)} comes next"
                )
            entries.append(e)
    return Published(entries, heads)


def publish(store: ObjectStore, head: SegmentHead, entries: list[ManifestEntry]) -> None:
    """Create segment `head.segment`; SegmentTaken, saying what it means, if another writer has."""
    body = head.line() + b"".join(e.to_line() for e in entries)
    try:
        store.put_bytes(
            store.url.key(segment_rel(head.segment)), body, create_only=True, content_type="application/x-ndjson"
        )
    except KeyExists:
        other = store.get_bytes(store.url.key(segment_rel(head.segment))) or b"{}"
        try:
            who = json.loads(other.split(b"\n", 1)[0]).get("writer", "?")
        except ValueError:
            who = "?"
        if who == head.writer:
            return  # our own publish, whose answer was lost and retried
        raise SegmentTaken(
            f"{store.url}: another drain ({who}) published manifest segment {head.segment} first: two drains write "
            f"this prefix. This one ({head.writer}) stops here; its samples not yet in the set are still staged, "
            "nothing is lost. Give each host its own prefix; restart this drain only once the other has stopped"
        ) from None


def epoch_head(writer: str, segment: int) -> SegmentHead:
    return SegmentHead(segment=segment, kind="epoch", writer=writer, epoch=segment, created_at=time.time())
