"""An ``--output`` of ``s3://bucket/prefix``: its local work directory, and a drain's start on it.

Every command that takes ``--output`` resolves it here. A directory is itself. A bucket prefix
gets a local *work directory* (``--work-dir``, by default
``/var/lib/hsextract/objectstore/<bucket>/<prefix>``), where the client, the drain and
``hsextract status`` keep what they keep in an output directory (status files, the client's
files, the drain's temporary files, the quarantine, a copy of the manifest), so they work on it
unchanged; the samples and the dataset-level files go to the bucket. The work directory records
which bucket it belongs to (``.hsextract/objectstore.json``: the URL, endpoint, region and
credentials file's path, never a secret), so `status` and ``finalize --verify`` find the set.

At a drain's start, before anything of a sample is sent (`open_drain`): the server is checked
(hsextract.objectstore.check: S3, the bucket, the credentials, conditional writes), the run's
identity is created in the bucket or must match the work directory's, the manifest's segments
are read back and the work directory's copy of the manifest is made equal to them (the bucket
is the truth). Then the drain's own start checks run on the work directory, and only once they
all passed does the drain publish its epoch segment (`take_over`), which fences every earlier
writer: a drain refused at start (another format, say) leaves the one at work untouched.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from hsextract.durable import atomic_write_bytes
from hsextract.errors import ConfigError
from hsextract.objectstore.retries import BACKOFF_FIRST_S, DEFAULT_ATTEMPTS
from hsextract.objectstore.segments import (
    HEADER_KEY,
    RUN_KEY,
    Published,
    SegmentTaken,
    epoch_head,
    new_writer_id,
    publish,
    read_published,
    segment_rel,
)
from hsextract.objectstore.settings import DEFAULT_READ_TIMEOUT_S, StoreSettings, settings_from, settings_from_args
from hsextract.objectstore.store import KeyExists, ObjectStore
from hsextract.objectstore.url import ObjectURL, is_object_url, parse_object_url, work_dir_for
from hsextract.output.layout import state_dir
from hsextract.output.manifest import (
    ManifestEntry,
    ManifestHeader,
    entries_path,
    iter_entries,
    read_header,
    write_header,
)

log = logging.getLogger("hsextract.objectstore")

TARGET_FILE = "objectstore.json"  # <work>/.hsextract/objectstore.json


@dataclass(frozen=True)
class ObjectOutput:
    """Where a drain's set goes: the bucket prefix, how to reach it, how many uploads at once."""

    url: ObjectURL
    settings: StoreSettings
    uploads: int = 8
    part_size: int = 32 << 20  # a sample of two parts or more goes up in parts


@dataclass
class DrainStart:
    """What a drain's start on a bucket established: the set as the bucket holds it, then (once the
    drain's own start checks passed, `take_over`) its writer id and epoch."""

    entries: list[ManifestEntry]
    next_segment: int  # the number the epoch segment takes
    writer: str = ""
    epoch: int = -1


def resolve_output(value: str | Path, args: object | None = None) -> tuple[Path, ObjectOutput | None]:
    """(the local directory every command works in, the bucket or None) of an ``--output``; `args`
    are the command's parsed flags or its settings (their ``work_dir`` and object-store flags)."""
    if not is_object_url(str(value)):
        return Path(value), None
    url = parse_object_url(str(value))
    settings = settings_from_args(args) if args is not None else StoreSettings()
    work = Path(work_dir_for(url, getattr(args, "work_dir", None) if args is not None else None))
    return work, ObjectOutput(url, settings)


def target_path(work: Path) -> Path:
    return state_dir(work) / TARGET_FILE


def record_target(work: Path, target: ObjectOutput) -> None:
    """Which bucket the work directory belongs to, and how to reach it (no secret)."""
    s = target.settings
    data = {
        "url": str(target.url),
        "endpoint": s.endpoint,
        "region": s.region,
        "credentials_file": s.credentials_file,
        "read_timeout_s": s.read_timeout_s,
        "attempts": s.attempts,
        "first_wait_s": s.first_wait_s,
    }
    state_dir(work).mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(target_path(work), (json.dumps(data, indent=2) + "\n").encode())


def recorded_target(work: Path) -> ObjectOutput | None:
    """The bucket a work directory belongs to, as its drain recorded it; None for a plain output."""
    try:
        data = json.loads(target_path(work).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return ObjectOutput(
        parse_object_url(data["url"]),
        settings_from(
            data.get("endpoint", ""),
            data.get("region", ""),
            data.get("credentials_file", ""),
            float(data.get("read_timeout_s") or DEFAULT_READ_TIMEOUT_S),
            int(data.get("attempts") or DEFAULT_ATTEMPTS),
            float(data.get("first_wait_s") or BACKOFF_FIRST_S),
        ),
    )


def open_drain(store: ObjectStore, work: Path, run_id: str, target: ObjectOutput) -> DrainStart:
    """Check the server and bring the work directory in line with the bucket, fencing no one (what
    it writes there is the canary, and the run's identity on a new prefix): the drain's own start
    checks (its configuration against the header, the staging directory) run on the work directory
    after this, and only then does `take_over` fence the prefix's earlier writers. A drain refused
    at start must not stop the one at work there."""
    from hsextract.objectstore.check import check_store

    check_store(store)
    record_target(work, target)
    _same_run(store, work, run_id)
    published = read_published(store)
    _sync_header(store, work, bool(published.entries))
    _sync_manifest(work, published.entries, store)
    return DrainStart(published.entries, published.next_segment)


def take_over(store: ObjectStore, start: DrainStart) -> DrainStart:
    """Publish the drain's epoch segment, which fences every earlier writer of the prefix, and
    abort the multipart uploads they left. SegmentTaken if another drain published since the
    bucket was read (`open_drain`)."""
    writer = new_writer_id()
    epoch = start.next_segment
    try:
        publish(store, epoch_head(writer, epoch), [])
    except SegmentTaken as exc:
        raise SegmentTaken(f"{exc} (at the drain's start)") from None
    log.info(
        "%s: %d samples in %d manifest segments; this drain is writer %s, epoch %d",
        store.url,
        len(start.entries),
        epoch,
        writer,
        epoch,
    )
    abort_fenced_uploads(store, epoch)
    return DrainStart(start.entries, epoch + 1, writer, epoch)


def sync_work_dir(store: ObjectStore, work: Path, published: Published) -> None:
    """The work directory's header and manifest made the bucket's (what a finalize writes from)."""
    work.mkdir(parents=True, exist_ok=True)
    _sync_header(store, work, bool(published.entries))
    _sync_manifest(work, published.entries, store)


def abort_fenced_uploads(store: ObjectStore, epoch: int) -> int:
    """Abort the multipart uploads the server began before `epoch`'s segment: a writer the epoch
    fenced (one killed mid-upload, say) can never name what they would make, so their parts only
    take space. Both times are the server's, so no clock of this host is trusted. Their number."""
    info = store.head(store.url.key(segment_rel(epoch)))
    if info is None or not info.last_modified:
        return 0
    stale = [
        (key, upload) for key, upload, began in store.incomplete_uploads() if began and began <= info.last_modified
    ]
    for key, upload in stale:
        store.abort_upload(key, upload)
    if stale:
        log.info(
            "%s: aborted %d multipart upload(s) of fenced writers (never completed, never named)", store.url, len(stale)
        )
    return len(stale)


def _same_run(store: ObjectStore, work: Path, run_id: str) -> None:
    body = json.dumps({"run_id": run_id}).encode()
    try:
        store.put_bytes(store.url.key(RUN_KEY), body, create_only=True, content_type="application/json")
        return
    except KeyExists:
        pass
    theirs = json.loads(store.get_bytes(store.url.key(RUN_KEY)) or b"{}").get("run_id")
    if theirs != run_id:
        raise ConfigError(
            f"{store.url} holds run {theirs}, but the work directory {work} is of run {run_id}: a prefix holds one "
            f"run's set. Resume with that run's work directory, or write {work}/run.json with "
            f'{{"run_id": "{theirs}"}} before any client starts, or give this run a new prefix'
        )


def _sync_header(store: ObjectStore, work: Path, has_samples: bool) -> None:
    """The bucket's manifest.json, if any, is the work directory's."""
    data = store.get_bytes(store.url.key(HEADER_KEY))
    if data is None:
        if has_samples:
            raise ConfigError(f"{store.url}: manifest segments name samples but manifest.json is missing; restore it")
        return
    remote = ManifestHeader.from_dict(json.loads(data))
    local = read_header(work)
    if local is None or asdict(local) != asdict(remote):
        write_header(work, remote)


def _sync_manifest(work: Path, published: list[ManifestEntry], store: ObjectStore) -> None:
    """The work directory's manifest.jsonl made equal to the segments' lines."""
    local = list(iter_entries(work))
    if [e.to_line() for e in local] == [e.to_line() for e in published]:
        return
    if len(local) > len(published) and [e.rid for e in local[: len(published)]] == [e.rid for e in published]:
        raise ConfigError(
            f"{work}/manifest.jsonl lists {len(local)} samples, the segments of {store.url} only "
            f"{len(published)}: segments are never deleted by hsextract; was the bucket's prefix "
            "emptied? Restore it, or start over with a new work directory and prefix"
        )
    log.warning(
        "%s: the work directory's manifest (%d samples) differs from the bucket's segments (%d): taking the bucket's",
        work,
        len(local),
        len(published),
    )
    atomic_write_bytes(entries_path(work), b"".join(e.to_line() for e in published))
