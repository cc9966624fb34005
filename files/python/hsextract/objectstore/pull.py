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

``--to-bf16`` pulls a set of FP8 rows as bf16 files (hsextract.formats.to_bf16): each object, once
it matches its manifest line and holds its sample (shapes, scales, fingerprint), is dequantized as
the trainer's reader does into a bf16 file verified in turn; the pulled manifest's lines are the new
files' (size, checksum, fingerprint), its header says bf16, and the journal keeps both checksums, so
a resumed pull knows what it converted. A pull of a bf16 set is unchanged by it.
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
from hsextract.formats.sample_check import SampleCheck
from hsextract.formats.to_bf16 import bf16_header, verified_conversion
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
    parser.add_argument(
        "--to-bf16",
        action="store_true",
        help="pull a set of FP8 rows (--precision fp8) as bf16 files, dequantized as the trainer's reader does "
        "(each verified; the manifest says bf16), for a consumer that reads bf16 rows",
    )
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
    n, nbytes, fetched = pull(store, dest, args.samples, args.parallel, to_bf16=args.to_bf16)
    print(
        f"pulled {n} samples ({size(nbytes)}, {fetched} downloaded now) from {store.url} into {dest}, "
        "each checked against the manifest"
    )
    print(f"object store {store.url}: {describe(store.retries.as_dict())}")
    return 0


def pull(
    store: ObjectStore, dest: Path, samples: str | None = None, parallel: int = 8, *, to_bf16: bool = False
) -> tuple[int, int, int]:
    """Pull the set (or the slice) into `dest`, FP8 rows as bf16 files given `to_bf16`; (samples,
    bytes, objects downloaded by this call)."""
    found = read_bucket_set(store)
    if found.header is None:
        raise ConfigError(f"{store.url}: no manifest.json: nothing was drained into this prefix yet")
    everything = found.published.entries
    first, last = parse_slice(samples, len(everything))
    chosen = [
        replace(e, output_index=i, file=found.fmt.relative_path(i), etag="")  # an ETag is the bucket's, not a file's
        for i, e in enumerate(everything[first:last])
    ]
    convert = to_bf16 and found.header.precision == "fp8"
    source = {"source": str(store.url), "samples": [first, last], "segments": len(found.published.heads)}
    claim(dest, {**source, "to_bf16": True} if convert else source)
    done = _verified(dest)
    pulled = {e.file: _pulled_entry(e, done.get(e.file), convert) for e in chosen}
    todo = [
        (src, e)
        for src, e in zip(everything[first:last], chosen, strict=True)
        if not _whole(dest / e.file, pulled[e.file])
    ]
    tmp = tmp_dir(dest)
    one = _OneSample(store, dest, tmp, SampleCheck(found.fmt, found.header) if convert else None, pulled)
    _fetch_all(dest, one.fetch, todo, parallel)
    for d in {(dest / e.file).parent for e in chosen}:
        fsync_dir(d)
    whole = (first, last) == (0, len(everything))
    written = [pulled[e.file] or e for e in chosen]
    header = bf16_header(found.header) if convert else found.header
    _write_set(store, dest, replace(found, header=header), written, whole, convert)
    with contextlib.suppress(OSError):
        tmp.rmdir()
    return len(chosen), sum(e.bytes for e in written), len(todo)


class _OneSample:
    """Downloads one sample object into the pull: checked against its manifest line, converted to a
    verified bf16 file where the pull converts (`check`: the FP8 set's), renamed into place, journaled."""

    def __init__(self, store: ObjectStore, dest: Path, tmp: Path, check: SampleCheck | None, pulled: dict):
        self.store, self.dest, self.tmp, self.check = store, dest, tmp, check
        self.pulled = pulled  # file -> its line in the pulled manifest (the bf16 file's, once converted)
        self._lock = threading.Lock()

    def fetch(self, pair: tuple[ManifestEntry, ManifestEntry]) -> None:
        src, e = pair
        store = self.store
        part = self.tmp / f"{e.output_index}.part"
        size, checksum = store.download(store.url.key(src.file), part, e.checksum.split(":", 1)[0])
        if size != e.bytes or checksum != e.checksum:
            part.unlink(missing_ok=True)
            raise PullError(
                f"{store.url}/{src.file}: {size} bytes with checksum {checksum}; its manifest line "
                f"says {e.bytes} bytes, {e.checksum}. The object is damaged: nothing of it was kept "
                f"(`hsextract finalize --output {store.url} --verify` checks them all)"
            )
        row: dict = {"file": e.file, "checksum": e.checksum}
        if self.check is not None:
            part, converted = _converted(self.check, store, src, part, e)
            self.pulled[e.file] = converted
            row["bf16"] = {
                "bytes": converted.bytes,
                "checksum": converted.checksum,
                "fingerprint": converted.fingerprint,
            }
        with open(part, "rb") as f:
            os.fsync(f.fileno())
        final = self.dest / e.file
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, final)
        with self._lock:
            append_journal(self.dest, json.dumps(row) + "\n")


def _fetch_all(dest: Path, fetch, todo: list, parallel: int) -> None:
    """`fetch` each of `todo` on `parallel` threads; a full volume is a PullError that says how to resume."""
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
    log.info("downloaded %d objects in %.1f s", len(todo), time.monotonic() - started)


def _converted(check: SampleCheck, store: ObjectStore, src: ManifestEntry, part: Path, e: ManifestEntry):
    """The downloaded FP8 object `part` (its size and checksum checked), checked to hold its sample and
    converted to a verified bf16 file beside it: (that file, its manifest line); PullError otherwise."""
    bf16 = part.with_suffix(".bf16")
    wrong = check.content_problem(part, e)
    converted, why = (None, wrong) if wrong else verified_conversion(check.fmt, part, bf16, e, check.header)
    part.unlink(missing_ok=True)
    if converted is None:
        raise PullError(f"{store.url}/{src.file}: {why}; nothing of it was kept")
    return bf16, converted


def _verified(dest: Path) -> dict[str, dict]:
    """The journal's rows by file: what was verified (and, for --to-bf16, what it was converted to)."""
    out: dict[str, dict] = {}
    for line in journal_text(dest).splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            row = json.loads(line)
            out[row["file"]] = row
    return out


def _pulled_entry(e: ManifestEntry, row: dict | None, convert: bool) -> ManifestEntry | None:
    """The manifest line of `e`'s file as an earlier pull left it (None: not pulled yet): the bucket's
    line, or where it was converted to bf16, the bf16 file's."""
    if row is None or row.get("checksum") != e.checksum:
        return None
    if not convert:
        return e
    bf16 = row.get("bf16")
    if not isinstance(bf16, dict):
        return None
    return replace(e, bytes=int(bf16["bytes"]), checksum=str(bf16["checksum"]), fingerprint=str(bf16["fingerprint"]))


def _whole(path: Path, e: ManifestEntry | None) -> bool:
    """Whether `path` is there with the size of its line `e` (None: not pulled yet)."""
    if e is None:
        return False
    try:
        return path.stat().st_size == e.bytes
    except FileNotFoundError:
        return False


def _write_set(
    store: ObjectStore, dest: Path, found, chosen: Sequence[ManifestEntry], whole: bool, converted: bool = False
) -> None:
    """The manifest of the pulled samples, then the dataset-level files: the bucket's, where they
    cover exactly these samples, else rebuilt from the pulled files. Files `converted` to bf16 are
    not the bucket's: the draft vocabulary's checkpoint, which names the files' checksums, is then
    written anew from them (the counts are the same)."""
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
                or (converted and rel == f"{STATE_DIR}/{VOCAB_CHECKPOINT}")
            ):
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            store.download(info.key, target)
        if finalized_samples(dest) == len(chosen) and not converted:
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
