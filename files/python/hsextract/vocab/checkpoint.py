"""The counts checkpoint: the token counts of the first ``covered`` manifest entries, crash-safe.

``<output>/.hsextract/vocab_counts.json`` is replaced atomically (temporary name, fsync, rename,
directory fsync) and is only ever written from counts of committed samples, so after any crash it
covers a prefix of the manifest: the drain recounts the entries past ``covered`` from their files
at start, and the counts equal a recount of the whole training set again. ``last`` identifies
the last covered entry, so a checkpoint that does not belong to this manifest (the manifest was
replaced or cut) is noticed and everything is recounted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.durable import atomic_write_bytes
from hsextract.output.layout import vocab_checkpoint_path
from hsextract.output.manifest import ManifestEntry
from hsextract.vocab.counts import TokenCounts

VERSION = 1


def checkpoint_path(output_dir: str | Path) -> Path:
    return vocab_checkpoint_path(output_dir)


def entry_identity(entry: ManifestEntry) -> dict[str, Any]:
    return {"output_index": entry.output_index, "rid": entry.rid, "checksum": entry.checksum}


@dataclass
class Checkpoint:
    covered: int  # manifest entries 0..covered-1 are counted
    last: dict[str, Any] | None  # entry_identity of entry covered-1
    counts: TokenCounts

    def matches(self, entries: list[ManifestEntry]) -> bool:
        """True if this checkpoint covers a prefix of `entries`."""
        if self.covered == 0:
            return self.counts.total == 0
        return self.covered <= len(entries) and entry_identity(entries[self.covered - 1]) == self.last


def checkpoint_bytes(cp: Checkpoint) -> bytes:
    ids, n = cp.counts.items()
    body = {
        "version": VERSION,
        "covered": cp.covered,
        "last": cp.last,
        "masked_tokens": cp.counts.total,
        "ids": ids.tolist(),
        "counts": n.tolist(),
    }
    return (json.dumps(body, separators=(",", ":")) + "\n").encode()


def write_checkpoint(output_dir: str | Path, cp: Checkpoint) -> None:
    atomic_write_bytes(checkpoint_path(output_dir), checkpoint_bytes(cp))


def read_checkpoint(output_dir: str | Path) -> tuple[Checkpoint | None, str]:
    """The checkpoint, or (None, why) when there is none or it cannot be used (then all is recounted)."""
    p = checkpoint_path(output_dir)
    try:
        body = json.loads(p.read_bytes())
        if body.get("version") != VERSION:
            return None, f"{p}: version {body.get('version')!r}, expected {VERSION}"
        ids, n = body["ids"], body["counts"]
        if len(ids) != len(n) or int(body["covered"]) < 0:
            return None, f"{p}: inconsistent contents"
        counts = TokenCounts.from_pairs(ids, n)
        if counts.total != int(body["masked_tokens"]):
            return None, f"{p}: its counts add up to {counts.total}, not its recorded {body['masked_tokens']}"
        return Checkpoint(int(body["covered"]), body.get("last"), counts), ""
    except FileNotFoundError:
        return None, "no checkpoint yet"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"{p}: unreadable ({exc})"
