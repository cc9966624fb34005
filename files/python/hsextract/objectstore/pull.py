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

``--to-bf16`` pulls a set of FP8 rows as bf16 files (hsextract.formats.to_bf16), in the format of
``--format`` (SpecForge's, ModelOpt's, speculators 0.7's: readers that read bf16 rows only; with
``--model`` where that format wants the final state post-norm), the set's own by default: each
object, once it matches its manifest line and holds its sample (shapes, scales, fingerprint), is
dequantized as the trainer's reader does into a bf16 file verified in turn; the pulled manifest's
lines are the new files' (name, size, checksum, fingerprint), its header says bf16 and the format,
and the journal keeps both checksums, so a resumed pull knows what it converted. The dataset-level
files are then the new format's, written here. A pull of a bf16 set is unchanged by it.
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
from dataclasses import dataclass, replace
from pathlib import Path

from hsextract.config_file import add_config_argument
from hsextract.durable import atomic_write_bytes, fsync_dir, is_no_space
from hsextract.errors import ConfigError, HsextractError
from hsextract.formats import FORMAT_NAMES
from hsextract.formats.sample_check import SampleCheck
from hsextract.formats.to_bf16 import Bf16Conversion, bf16_conversion
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
        "(each verified; the manifest says bf16), for a trainer that reads bf16 rows (with --format)",
    )
    parser.add_argument(
        "--format",
        choices=FORMAT_NAMES,
        help="with --to-bf16: the format of the bf16 files (default: the set's own, speculators); specforge, "
        "modelopt and speculators-v1 are read by trainers that read bf16 rows only",
    )
    parser.add_argument(
        "--model",
        type=Path,
        help="with --to-bf16 --format specforge or modelopt: the set's model directory, whose final norm turns "
        "the set's pre-norm final state into the post-norm one those formats hold",
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
    if (args.format or args.model) and not args.to_bf16:
        raise ConfigError("--format and --model choose what --to-bf16 writes: give --to-bf16 with them")
    as_bf16 = Bf16Request(args.format, args.model) if args.to_bf16 else None
    n, nbytes, fetched = pull(store, dest, args.samples, args.parallel, as_bf16=as_bf16)
    print(
        f"pulled {n} samples ({size(nbytes)}, {fetched} downloaded now) from {store.url} into {dest}, "
        "each checked against the manifest"
    )
    print(f"object store {store.url}: {describe(store.retries.as_dict())}")
    return 0


@dataclass(frozen=True)
class Bf16Request:
    """``--to-bf16``: FP8 rows as bf16 files of `format` (the set's own by default), through the final
    norm of `model` where that format wants the final state post-norm."""

    format: str | None = None
    model: Path | None = None


def pull(
    store: ObjectStore,
    dest: Path,
    samples: str | None = None,
    parallel: int = 8,
    *,
    as_bf16: Bf16Request | None = None,
) -> tuple[int, int, int]:
    """Pull the set (or the slice) into `dest`, FP8 rows as bf16 files given `as_bf16`; (samples,
    bytes, objects downloaded by this call)."""
    found = read_bucket_set(store)
    if found.header is None:
        raise ConfigError(f"{store.url}: no manifest.json: nothing was drained into this prefix yet")
    conversion = _conversion(found.header, as_bf16)
    fmt = conversion.target if conversion else found.fmt
    everything = found.published.entries
    first, last = parse_slice(samples, len(everything))
    chosen = [
        replace(e, output_index=i, file=fmt.relative_path(i), etag="")  # an ETag is the bucket's, not a file's
        for i, e in enumerate(everything[first:last])
    ]
    convert = conversion is not None
    source = {"source": str(store.url), "samples": [first, last], "segments": len(found.published.heads)}
    claim(dest, {**source, "to_bf16": True, "format": fmt.name} if convert else source)
    done = _verified(dest)
    pulled = {e.file: _pulled_entry(e, done.get(e.file), convert) for e in chosen}
    todo = [
        (src, e)
        for src, e in zip(everything[first:last], chosen, strict=True)
        if not _whole(dest / e.file, pulled[e.file])
    ]
    tmp = tmp_dir(dest)
    check = SampleCheck(found.fmt, found.header)
    one = _OneSample(store, dest, tmp, (check, conversion) if conversion else None, pulled)
    _fetch_all(dest, one.fetch, todo, parallel)
    for d in {(dest / e.file).parent for e in chosen}:
        fsync_dir(d)
    whole = (first, last) == (0, len(everything))
    written = [pulled[e.file] or e for e in chosen]
    header = conversion.header if conversion else found.header
    _write_set(store, dest, replace(found, header=header, fmt=fmt), written, whole, conversion)
    with contextlib.suppress(OSError):
        tmp.rmdir()
    return len(chosen), sum(e.bytes for e in written), len(todo)


class _OneSample:
    """Downloads one sample object into the pull: checked against its manifest line, converted to a
    verified bf16 file where the pull converts (`check`: the FP8 set's), renamed into place, journaled."""

    def __init__(
        self,
        store: ObjectStore,
        dest: Path,
        tmp: Path,
        convert: tuple[SampleCheck, Bf16Conversion] | None,
        pulled: dict,
    ):
        self.store, self.dest, self.tmp, self.convert = store, dest, tmp, convert
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
        if self.convert is not None:
            part, converted = _converted(*self.convert, store, src, part, e)
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


def _conversion(header, as_bf16: Bf16Request | None) -> Bf16Conversion | None:
    """How the pull converts the set's files (None: it copies them as they are)."""
    if as_bf16 is None:
        return None
    if header.precision != "fp8":
        if as_bf16.format not in (None, header.format):
            raise ConfigError(
                f"--to-bf16 --format {as_bf16.format}: the set holds bf16 rows in the {header.format} format, "
                "which the pull keeps; --format chooses the format of bf16 files made of FP8 rows"
            )
        return None
    return bf16_conversion(header, as_bf16.format, as_bf16.model)


def _converted(
    check: SampleCheck, conversion: Bf16Conversion, store: ObjectStore, src: ManifestEntry, part: Path, e: ManifestEntry
):
    """The downloaded FP8 object `part` (its size and checksum checked), checked to hold its sample and
    converted to a verified bf16 file beside it: (that file, its manifest line); PullError otherwise."""
    bf16 = part.with_suffix(".bf16")
    wrong = check.content_problem(part, e)
    converted, why = (None, wrong) if wrong else conversion.verified(part, bf16, e)
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
    store: ObjectStore,
    dest: Path,
    found,
    chosen: Sequence[ManifestEntry],
    whole: bool,
    conversion: Bf16Conversion | None = None,
) -> None:
    """The manifest of the pulled samples, then the dataset-level files: the bucket's, where they
    cover exactly these samples, else rebuilt from the pulled files. Files converted to bf16 are not
    the bucket's: the draft vocabulary's checkpoint, which names the files' checksums, is then written
    anew from them (the counts are the same); files converted into another format get every
    dataset-level file of that format written here (none of the bucket's is theirs)."""
    from hsextract.output.finalized import finalized_samples, record_finalized

    write_header(dest, found.header)
    atomic_write_bytes(entries_path(dest), b"".join(e.to_line() for e in chosen))
    reformatted = conversion if conversion is not None and conversion.reformats else None
    if whole and reformatted is None and _bucket_files_cover(store, len(chosen)):
        for info in store.list_objects():
            rel = store.url.rel(info.key)
            if (
                found.fmt.file_pattern.match(rel)
                or rel == "manifest.json"
                or (rel.startswith(f"{STATE_DIR}/") and rel not in KEEP_STATE)
                or (conversion is not None and rel == f"{STATE_DIR}/{VOCAB_CHECKPOINT}")
            ):
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            store.download(info.key, target)
        if finalized_samples(dest) == len(chosen) and conversion is None:
            return
    found.fmt.finalize(dest, found.header, list(chosen))
    from hsextract.vocab.mapping import DEFAULT_DRAFT_VOCAB_SIZE
    from hsextract.vocab.tracker import VocabTracker

    tracker = VocabTracker(dest, found.fmt, [DEFAULT_DRAFT_VOCAB_SIZE], checkpoint_interval_s=0.0)
    tracker.recover(list(chosen))
    if found.header.vocab_size:
        tracker.write_files(found.header.vocab_size)
    if reformatted is not None:
        _write_draft_files(dest, found.header, chosen, reformatted)
    record_finalized(dest, len(chosen))


def _write_draft_files(dest: Path, header, entries: Sequence[ManifestEntry], conversion: Bf16Conversion) -> None:
    """The new format's draft config (and SpecForge's run file) for the default draft vocabulary,
    from the model the conversion read, else the one the manifest names; a model that cannot be read
    is said, with the command to run."""
    from hsextract.draft_config import write_set_draft_files
    from hsextract.vocab.mapping import DEFAULT_DRAFT_VOCAB_SIZE, resolve_sizes

    norm = conversion.final_norm
    size = resolve_sizes([DEFAULT_DRAFT_VOCAB_SIZE], header.vocab_size)[0].size if header.vocab_size else None
    try:
        write_set_draft_files(
            dest, header, entries, norm.model if norm else header.model_path, size or DEFAULT_DRAFT_VOCAB_SIZE
        )
    except (OSError, ValueError, HsextractError) as exc:
        log.error(
            "draft_config.json not written (%s); write it with `hsextract draft-config --output %s --model "
            "<the model directory>`",
            exc,
            dest,
        )


def _bucket_files_cover(store: ObjectStore, n: int) -> bool:
    data = store.get_bytes(store.url.key(f"{STATE_DIR}/{FINALIZED}"))
    if data is None:
        return False
    try:
        return int(json.loads(data).get("samples", -1)) == n
    except (ValueError, AttributeError):
        return False
