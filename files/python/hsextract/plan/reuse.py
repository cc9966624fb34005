"""A plan's scan and sizes kept beside its report, and reused while nothing they depend on changes.

The scan tokenizes the whole shard (minutes for a few million conversations) and the sizes load
torch (seconds): the play plans again at every run, and most runs plan the same inputs. The scan is
kept per sample (index, tokens, loss-masked tokens, the length it was cut from), so a run that has
written more samples since reuses it: which samples remain is decided again from the output's
manifest. It is reused only when its key matches: the hsextract sources, the tokenizer libraries'
versions, every setting of the scan, the chat template, and the size and modification time of each
dataset file and of each file of the model directory. The sizes are reused when the samples' shapes,
the layout and the vocabularies are those they were computed for.

A missing, unreadable or stale file is a fresh scan, never an error: the file only saves time.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from hsextract.durable import atomic_write_bytes
from hsextract.output.run_files import read_json_object
from hsextract.plan.report import FormatBytes
from hsextract.plan.scan import ScanResult, ScanSettings

VERSION = 1  # of the file's layout


def scan_path(report: Path) -> Path:
    """Where the scan of the report at `report` is kept: beside it (plan.json -> plan.scan.json)."""
    return report.with_name(f"{report.stem}.scan.json")


@functools.cache
def package_digest() -> str:
    """The hsextract sources' digest: any change to how a row is read or encoded is a new scan."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _files(paths: Iterable[Path]) -> list[list[Any]]:
    out = []
    for p in paths:
        st = p.stat()
        out.append([str(p), st.st_size, st.st_mtime_ns])
    return out


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def scan_key(cfg: ScanSettings) -> str:
    """The digest of everything the scan of `cfg` reads; another scan of equal key gives the same result."""
    from hsextract.dataset.reader import dataset_files

    model = Path(cfg.model)
    inputs = {
        "version": VERSION,
        "package": package_digest(),
        "libraries": {d: _version(d) for d in ("transformers", "tokenizers", "jinja2")},
        "dataset": _files(Path(f.path) for f in dataset_files(cfg.dataset)),
        "model": _files(sorted(p for p in model.iterdir() if p.is_file())),
        "settings": [
            cfg.chat_template,
            cfg.max_tokens,
            cfg.overlong,
            cfg.last_turn_only,
            cfg.min_loss_tokens,
            cfg.shard.to_json(),
            cfg.max_row_bytes,
            cfg.context_length,
            cfg.kv_pool_tokens,
        ],
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def sizes_key(res: ScanResult, layout: dict[str, Any], vocab_size: int, draft_sizes: list[int]) -> str:
    """The digest of everything the per-format sizes of `res` depend on."""
    inputs = {
        "package": package_digest(),
        "layout": layout,
        "vocab_size": vocab_size,
        "draft_sizes": draft_sizes,
        "shapes": sorted(map(list, res.shapes.items())),
        "pending": sorted(map(list, res.pending_shapes.items())),
        "samples": res.samples,
        "tokens": res.tokens,
        "already_written": res.already_written,
        "pending_tokens": res.pending_tokens,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


class Kept:
    """The file's content: the last scan under its key, and the last sizes under theirs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {}
        self.changed = False  # a scan or sizes put in since it was read: the file is written again
        data = read_json_object(path)
        if data is not None and data.get("version") == VERSION:
            self.data = data

    def scan(self, key: str, done: frozenset[int]) -> ScanResult | None:
        """The kept scan of this key, with `done` (the samples written since) taken out of what remains."""
        s = self.data.get("scan")
        if not isinstance(s, dict) or s.get("key") != key:
            return None
        try:
            res = ScanResult(
                lines=int(s["lines"]),
                in_shard=int(s["in_shard"]),
                workers=int(s["workers"]),
                seconds=float(s["seconds"]),
                max_tokens=s["max_tokens"],
                rejects=Counter({str(k): int(v) for k, v in s["rejects"].items()}),
                examples={str(k): str(v) for k, v in s["examples"].items()},
                reused=True,
            )
            for index, tokens, masked, cut in zip(
                s["index"], s["tokens"], s["masked"], s["truncated_from"], strict=True
            ):
                res.add(index, tokens, masked, cut, done)
        except (KeyError, TypeError, ValueError):
            return None
        return res

    def keep_scan(self, key: str, res: ScanResult) -> None:
        self.changed = True
        self.data = {
            "version": VERSION,
            "scan": {
                "key": key,
                "lines": res.lines,
                "in_shard": res.in_shard,
                "workers": res.workers,
                "seconds": res.seconds,
                "max_tokens": res.max_tokens,
                "rejects": dict(res.rejects),
                "examples": res.examples,
                **{name: list(column) for name, column in res.columns().items()},
            },
        }

    def sizes(self, key: str) -> dict[str, FormatBytes] | None:
        """The kept sizes of this key (`FormatBytes`, by format), or None."""
        s = self.data.get("sizes")
        if not isinstance(s, dict) or s.get("key") != key:
            return None
        try:
            return {str(name): FormatBytes.from_json(f) for name, f in s["formats"].items()}
        except (AttributeError, KeyError, TypeError):
            return None

    def keep_sizes(self, key: str, formats: Mapping[str, FormatBytes]) -> None:
        self.changed = True
        kept = {name: f.to_json() for name, f in formats.items()}
        self.data = {**self.data, "version": VERSION, "sizes": {"key": key, "formats": kept}}

    def write(self) -> str | None:
        """Write the file if anything was put in it (a reused scan of millions of samples is not
        rewritten at every plan); None, or why it could not be written (the plan stands without it)."""
        if not self.changed:
            return None
        try:
            atomic_write_bytes(self.path, json.dumps(self.data, separators=(",", ":")).encode(), durable=False)
        except OSError as exc:
            return exc.strerror or str(exc)
        return None
