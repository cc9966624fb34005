"""``hsextract pull s3://bucket/prefix DIR``: a set (or a slice of it) from a bucket into a directory
each trainer's reader loads as it loads a local set.

Every sample object the manifest's segments name is downloaded in parallel into a temporary name,
hashed as it streams in, compared with its manifest line (size and checksum), then renamed into
place; what was verified is recorded (``.hsextract/pulled.jsonl``), so an interrupted pull resumes
with the samples it lacks. The destination's bookkeeping is written only into a ``.hsextract`` the
pull made, never through a link (hsextract.objectstore.pull_dest). A slice (``--samples A:B``,
output indices) is renumbered from 0, as a trainer's reader wants its files; the bytes of each file
are unchanged, so its checksum still holds. The manifest (``manifest.json``, ``manifest.jsonl``) is
written for the samples pulled, and the dataset-level files are the bucket's when the whole set is
pulled and the bucket's cover it, else rebuilt here from the pulled files, as ``hsextract finalize``
would.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from hsextract.config_file import add_config_argument
from hsextract.durable import atomic_write_bytes, fsync_dir, is_no_space
from hsextract.errors import ConfigError, HsextractError
from hsextract.objectstore.pull_dest import append_journal, claim, journal_text, tmp_dir
from hsextract.objectstore.retries import describe
from hsextract.objectstore.settings import add_store_arguments, settings_from_args
from hsextract.objectstore.store import ObjectStore
from hsextract.objectstore.url import parse_object_url
from hsextract.objectstore.verify import read_bucket_set
from hsextract.output.layout import FINALIZED, STATE_DIR, VOCAB_CHECKPOINT
from hsextract.output.manifest import ManifestEntry, entries_path, write_header
from hsextract.units import size

log = logging.getLogger("hsextract.pull")

# Of the bucket's bookkeeping, what a pulled set keeps: what its dataset-level files cover, and the
# draft vocabulary's counts (hsextract finalize --verify checks them against the files).
KEEP_STATE = (f"{STATE_DIR}/{FINALIZED}", f"{STATE_DIR}/{VOCAB_CHECKPOINT}")


class PullError(HsextractError):
    """An object did not match its manifest line, or the destination's volume is full."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="the set: s3://bucket/prefix")
    parser.add_argument("dest", help="the directory to pull it into (created; a pull resumes in it)")
    parser.add_argument(
        "--samples", metavar="A:B", help="only output indices A to B-1 of the set (renumbered from 0); default: all"
    )
    parser.add_argument("--parallel", type=int, default=8, help="objects downloaded at once (default 8)")
    add_store_arguments(parser)
    add_config_argument(parser)


def parse_slice(text: str | None, n: int) -> tuple[int, int]:
    if not text:
        return 0, n
    a, sep, b = text.partition(":")
    try:
        first, last = int(a or 0), int(b) if b else n
    except ValueError:
        raise ConfigError(f"--samples {text!r}: give A:B, output indices from A to B-1") from None
    if not sep or not 0 <= first < last <= n:
        raise ConfigError(f"--samples {text!r}: give A:B with 0 <= A < B <= {n} (the set has {n} samples)")
    return first, last


def run(args: argparse.Namespace) -> int:
    if args.parallel < 1:
        raise ConfigError(f"--parallel {args.parallel}: give at least 1")
    store = ObjectStore(parse_object_url(args.source, "source"), settings_from_args(args), pool=args.parallel + 4)
    dest = Path(args.dest)
    n, nbytes, fetched = pull(store, dest, args.samples, args.parallel)
    print(
        f"pulled {n} samples ({size(nbytes)}, {fetched} downloaded now) from {store.url} into {dest}, "
        "each checked against the manifest"
    )
    print(f"object store {store.url}: {describe(store.retries.as_dict())}")
    return 0


def pull(store: ObjectStore, dest: Path, samples: str | None = None, parallel: int = 8) -> tuple[int, int, int]:
    """Pull the set (or the slice) into `dest`; (samples, bytes, objects downloaded by this call)."""
    found = read_bucket_set(store)
    if found.header is None:
        raise ConfigError(f"{store.url}: no manifest.json: nothing was drained into this prefix yet")
    everything = found.published.entries
    first, last = parse_slice(samples, len(everything))
    chosen = [
        replace(e, output_index=i, file=found.fmt.relative_path(i), etag="")  # an ETag is the bucket's, not a file's
        for i, e in enumerate(everything[first:last])
    ]
    source = {"source": str(store.url), "samples": [first, last], "segments": len(found.published.heads)}
    claim(dest, source)
    done = _verified(dest)
    todo = [
        (src, e)
        for src, e in zip(everything[first:last], chosen, strict=True)
        if done.get(e.file) != e.checksum or not _whole(dest / e.file, e)
    ]
    tmp = tmp_dir(dest)
    record_lock = threading.Lock()

    def fetch(pair: tuple[ManifestEntry, ManifestEntry]) -> None:
        src, e = pair
        part = tmp / f"{e.output_index}.part"
        size, checksum = store.download(store.url.key(src.file), part, e.checksum.split(":", 1)[0])
        if size != e.bytes or checksum != e.checksum:
            part.unlink(missing_ok=True)
            raise PullError(
                f"{store.url}/{src.file}: {size} bytes with checksum {checksum}; its manifest line "
                f"says {e.bytes} bytes, {e.checksum}. The object is damaged: nothing of it was kept "
                f"(`hsextract finalize --output {store.url} --verify` checks them all)"
            )
        with open(part, "rb") as f:
            os.fsync(f.fileno())
        final = dest / e.file
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, final)
        with record_lock:
            append_journal(dest, json.dumps({"file": e.file, "checksum": e.checksum}) + "\n")

    started = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            list(pool.map(fetch, todo))
    except OSError as exc:
        if not is_no_space(exc):
            raise
        raise PullError(
            f"{exc.filename or dest}: {exc.strerror or exc}: the volume of {dest} is full. What was pulled and "
            "verified is kept; make room and run the same pull again: it resumes with the samples it lacks"
        ) from None
    for d in {(dest / e.file).parent for e in chosen}:
        fsync_dir(d)
    log.info("downloaded %d objects in %.1f s", len(todo), time.monotonic() - started)
    whole = (first, last) == (0, len(everything))
    _write_set(store, dest, found, chosen, whole)
    with contextlib.suppress(OSError):
        tmp.rmdir()
    return len(chosen), sum(e.bytes for e in chosen), len(todo)


def _verified(dest: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in journal_text(dest).splitlines():
        with contextlib.suppress(ValueError, KeyError):
            row = json.loads(line)
            out[row["file"]] = row["checksum"]
    return out


def _whole(path: Path, e: ManifestEntry) -> bool:
    try:
        return path.stat().st_size == e.bytes
    except FileNotFoundError:
        return False


def _write_set(store: ObjectStore, dest: Path, found, chosen: Sequence[ManifestEntry], whole: bool) -> None:
    """The manifest of the pulled samples, then the dataset-level files: the bucket's, where they
    cover exactly these samples, else rebuilt from the pulled files."""
    from hsextract.output.finalized import finalized_samples, record_finalized

    write_header(dest, found.header)
    atomic_write_bytes(entries_path(dest), b"".join(e.to_line() for e in chosen))
    if whole and _bucket_files_cover(store, len(chosen)):
        for info in store.list_objects():
            rel = store.url.rel(info.key)
            if (
                found.fmt.file_pattern.match(rel)
                or rel == "manifest.json"
                or (rel.startswith(f"{STATE_DIR}/") and rel not in KEEP_STATE)
            ):
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            store.download(info.key, target)
        if finalized_samples(dest) == len(chosen):
            return
    found.fmt.finalize(dest, found.header, list(chosen))
    from hsextract.vocab.mapping import DEFAULT_DRAFT_VOCAB_SIZE
    from hsextract.vocab.tracker import VocabTracker

    tracker = VocabTracker(dest, found.fmt, [DEFAULT_DRAFT_VOCAB_SIZE], checkpoint_interval_s=0.0)
    tracker.recover(list(chosen))
    if found.header.vocab_size:
        tracker.write_files(found.header.vocab_size)
    record_finalized(dest, len(chosen))


def _bucket_files_cover(store: ObjectStore, n: int) -> bool:
    data = store.get_bytes(store.url.key(f"{STATE_DIR}/{FINALIZED}"))
    if data is None:
        return False
    try:
        return int(json.loads(data).get("samples", -1)) == n
    except (ValueError, AttributeError):
        return False
