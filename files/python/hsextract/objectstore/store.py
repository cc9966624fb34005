"""One bucket through boto3: conditional creates, multipart, reads, lists, with backoff and clear errors.

Two kinds of failure are told apart here, once, for every caller:

* the server is unreachable or failing for now (refused or reset connections, timeouts, 5xx,
  SlowDown, an answer cut short): `retrying` waits and tries again with exponential backoff
  (0.5 s doubling to 20 s): an unreachable server until it answers or the caller's stop event is
  set (`Stopped`), so a server stopped mid-run holds the drain, it does not fail it, and nothing
  staged is lost meanwhile; a request the server answered with a failure at most `attempts`
  times (`RequestFailed`). Every retry is counted (hsextract.objectstore.retries);
* anything else (refused credentials, a missing bucket, a refused precondition the caller did
  not expect) is raised at once as `StoreError`, whose message names the bucket and key, never a
  secret.

A create with ``If-None-Match: *`` that meets an existing key raises `KeyExists`: the caller
decides (hsextract.objectstore.committer).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hsextract.objectstore import multipart
from hsextract.objectstore.local_files import stream_into
from hsextract.objectstore.retries import (
    Outage,
    RetryLog,
    backoff,
    before_retry,
    is_transient,
    is_unreachable,
)
from hsextract.objectstore.settings import StoreSettings
from hsextract.objectstore.store_errors import (
    KeyExists,
    ObjectMissing,
    Refused412,
    RequestFailed,
    SourceChanged,
    Stopped,
    StoreError,
    Unreachable,
    UploadAborted,
    code_of,
    describe_refusal,
    status_of,
)
from hsextract.objectstore.url import ObjectURL

__all__ = [  # the error vocabulary is hsextract.objectstore.store_errors'; callers take it from here too
    "KeyExists",
    "ObjectInfo",
    "ObjectMissing",
    "ObjectStore",
    "RequestFailed",
    "SourceChanged",
    "Stopped",
    "StoreError",
    "Unreachable",
    "UploadAborted",
    "code_of",
    "describe_refusal",
    "status_of",
]

log = logging.getLogger("hsextract.objectstore")

T = TypeVar("T")

# A sample file of at least two parts goes up in parts (S3's smallest part is 5 MiB).
PART_SIZE = 32 << 20
MIN_PART_SIZE = 5 << 20


@dataclass
class ObjectInfo:
    key: str
    size: int
    etag: str
    metadata: dict[str, str]
    last_modified: float = 0.0


def _boto():  # imported late: only an object-store output pays for boto3
    import boto3
    import botocore.config
    import botocore.exceptions

    return boto3, botocore.config, botocore.exceptions


def make_client(settings: StoreSettings, pool: int = 32) -> Any:
    """A boto3 S3 client for the settings: path-style addressing (what every self-hosted server
    takes), botocore's own retries off (ours wait longer and count them; its ``max_attempts`` is
    a number of retries, so one of 1 retried every request once, unseen), CRC32 sent with every body."""
    boto3, config, _ = _boto()
    cfg = config.Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=5,
        read_timeout=settings.read_timeout_s,
        max_pool_connections=pool,
        s3={"addressing_style": "path"},
        request_checksum_calculation="when_supported",
        response_checksum_validation="when_supported",
    )
    return boto3.session.Session().client("s3", config=cfg, **settings.client_kwargs())


class ObjectStore:
    """One bucket and prefix, one client, shared by threads (boto3 clients are thread-safe)."""

    def __init__(
        self,
        url: ObjectURL,
        settings: StoreSettings,
        stop: threading.Event | None = None,
        client: Any = None,
        pool: int = 32,
        part_size: int = PART_SIZE,
        patient: bool = True,
        retries: RetryLog | None = None,
    ):
        self.url = url
        # Whether `retrying` waits out an unreachable server (the samples' uploads) or raises
        # `Unreachable` at once (the dataset-level files: the daemon writes them when it can); a
        # request the server answers with a failure is tried `attempts` times either way.
        self.patient = patient
        self.part_size = max(MIN_PART_SIZE, part_size)
        self.settings = settings
        self.stop = stop or threading.Event()
        self.client = client if client is not None else make_client(settings, pool)
        self._outage = Outage(str(url))
        self.retries = retries if retries is not None else RetryLog(settings.attempts)

    def __str__(self) -> str:
        return str(self.url)

    @property
    def outage_since(self) -> float:
        return self._outage.since

    def impatient(self) -> ObjectStore:
        """The same bucket and client, raising `Unreachable` instead of waiting."""
        return ObjectStore(
            self.url,
            self.settings,
            self.stop,
            client=self.client,
            part_size=self.part_size,
            patient=False,
            retries=self.retries,
        )

    # --- waiting out an unreachable server ------------------------------------------------------

    def retrying(self, what: str, call: Callable[[], T]) -> T:
        """`call()`, tried again with backoff while it fails for a transient cause (see the module
        docstring): `Stopped` if the stop event is set meanwhile, `RequestFailed` once the server
        failed it `attempts` times (an impatient store raises `Unreachable` instead, and at once when
        the server is unreachable: its caller comes back later); anything else raised as it came."""
        failed = waits = 0
        while True:
            try:
                result = call()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                unreachable = is_unreachable(exc)
                failed += not unreachable
                waits += 1
                if unreachable:
                    self._outage.begin(what, exc)
                delay = backoff(waits, self.settings.first_wait_s)
                before_retry(self.retries, str(self.url), what, exc, unreachable, failed, self.patient, delay)
                if self.stop.wait(delay):
                    raise Stopped(f"stopped while {self.url} did not answer ({what})") from exc
                continue
            self._outage.end()
            return result

    # --- requests -----------------------------------------------------------------------------

    def head(self, key: str) -> ObjectInfo | None:
        """The object's size, ETag and metadata; None if there is none."""
        _, _, errors = _boto()

        def call() -> ObjectInfo | None:
            try:
                r = self.client.head_object(Bucket=self.url.bucket, Key=key)
            except errors.ClientError as exc:
                if status_of(exc) == 404:
                    return None
                raise
            return ObjectInfo(
                key,
                int(r["ContentLength"]),
                r.get("ETag", ""),
                dict(r.get("Metadata") or {}),
                r["LastModified"].timestamp() if r.get("LastModified") else 0.0,
            )

        return self._checked(f"HEAD {key}", call)

    def get_bytes(self, key: str, first: int | None = None, last: int | None = None) -> bytes | None:
        """The object's bytes (or bytes first..last, inclusive); None if there is no such object."""
        _, _, errors = _boto()
        kw: dict[str, Any] = {}
        if first is not None:
            kw["Range"] = f"bytes={first}-{'' if last is None else last}"

        def call() -> bytes | None:
            try:
                r = self.client.get_object(Bucket=self.url.bucket, Key=key, **kw)
            except errors.ClientError as exc:
                if status_of(exc) == 404 or code_of(exc) == "NoSuchKey":
                    return None
                raise
            return r["Body"].read()

        return self._checked(f"GET {key}", call)

    def download(self, key: str, dest: Path, algorithm: str = "", chunk: int = 8 << 20) -> tuple[int, str]:
        """The object into `dest` (created or truncated, never through a link: `new_file`), hashed
        on the way with `algorithm` (the manifest's); (byte count, "<algorithm>:<hex>" or ""). A
        write that fails (a full volume) raises an OSError naming `dest`."""

        def call() -> tuple[int, str]:
            r = self.client.get_object(Bucket=self.url.bucket, Key=key)
            return stream_into(r["Body"], dest, algorithm, chunk)  # the server's faults raised as they come

        return self._checked(f"GET {key}", call)

    def put_bytes(
        self,
        key: str,
        data: bytes,
        *,
        create_only: bool = False,
        metadata: dict[str, str] | None = None,
        content_type: str = "",
    ) -> str:
        """PUT `data` (with ``If-None-Match: *`` when `create_only`: `KeyExists` if the key exists); its ETag."""
        kw: dict[str, Any] = {"Bucket": self.url.bucket, "Key": key, "Body": data, "Metadata": metadata or {}}
        if create_only:
            kw["IfNoneMatch"] = "*"
        if content_type:
            kw["ContentType"] = content_type
        r = self._checked(f"PUT {key}", lambda: self.client.put_object(**kw), create=create_only)
        return str(r.get("ETag", ""))

    def put_file(
        self,
        key: str,
        path: Path,
        size: int,
        *,
        create_only: bool,
        metadata: dict[str, str] | None = None,
        part_pool: Any = None,
    ) -> str:
        """Upload a file: one PUT, or in parts when it makes two or more (completed with
        If-None-Match when `create_only`; an upload that fails is aborted, so no part lingers). Its ETag."""
        if size < 2 * self.part_size:

            def single() -> Any:
                with open(path, "rb") as f:
                    kw: dict[str, Any] = {
                        "Bucket": self.url.bucket,
                        "Key": key,
                        "Body": f,
                        "Metadata": metadata or {},
                        "ContentLength": size,
                    }
                    if create_only:
                        kw["IfNoneMatch"] = "*"
                    return self.client.put_object(**kw)

            return str(self._checked(f"PUT {key}", single, create=create_only).get("ETag", ""))
        return multipart.put_in_parts(
            self.client,
            self.url,
            key,
            path,
            size,
            self.part_size,
            create_only,
            metadata or {},
            part_pool,
            self._checked,
        )

    def copy(
        self,
        source_key: str,
        key: str,
        *,
        source: ObjectURL | None = None,
        create_only: bool = True,
        metadata: dict[str, str] | None = None,
        source_etag: str = "",
    ) -> str:
        """A server-side copy (no byte passes through this process); its ETag. With `source_etag`,
        made only while the source has that ETag (`SourceChanged` otherwise); `ObjectMissing`
        when there is no source; `KeyExists` when `create_only` meets an object at `key`."""
        src = source or self.url
        kw: dict[str, Any] = {
            "Bucket": self.url.bucket,
            "Key": key,
            "CopySource": {"Bucket": src.bucket, "Key": source_key},
        }
        if metadata is not None:
            kw["Metadata"] = metadata
            kw["MetadataDirective"] = "REPLACE"
        if create_only:
            kw["IfNoneMatch"] = "*"
        if source_etag:
            kw["CopySourceIfMatch"] = source_etag
        what = f"copy {source_key} to {key}"
        try:
            r = self._checked(what, lambda: self.client.copy_object(**kw), create=create_only)
        except KeyExists:  # a 412: the key exists, or (nothing there) the source changed
            if source_etag and self.head(key) is None:
                raise SourceChanged(f"{self.url}: {what}: the source is no longer what was checked") from None
            raise
        except Refused412:  # not a create: only the source's condition can fail
            raise SourceChanged(f"{self.url}: {what}: the source is no longer what was checked") from None
        return str(r.get("CopyObjectResult", {}).get("ETag", ""))

    def delete(self, key: str) -> None:
        self._checked(f"DELETE {key}", lambda: self.client.delete_object(Bucket=self.url.bucket, Key=key))

    def list_objects(self, prefix_rel: str = "") -> Iterator[ObjectInfo]:
        """Every object under ``<prefix>/<prefix_rel>``, in key order."""
        full = self.url.key(prefix_rel) if prefix_rel else (self.url.prefix + "/" if self.url.prefix else "")
        token = None
        while True:
            kw: dict[str, Any] = {"Bucket": self.url.bucket, "Prefix": full}
            if token:
                kw["ContinuationToken"] = token
            r: dict[str, Any] = self._checked(f"LIST {full}", functools.partial(self.client.list_objects_v2, **kw))
            for item in r.get("Contents") or []:
                yield ObjectInfo(
                    item["Key"],
                    int(item["Size"]),
                    item.get("ETag", ""),
                    {},
                    item["LastModified"].timestamp() if item.get("LastModified") else 0.0,
                )
            if not r.get("IsTruncated"):
                return
            token = r.get("NextContinuationToken")

    def incomplete_uploads(self) -> list[tuple[str, str, float]]:
        """(key, upload id, when the server began it) of the multipart uploads under the prefix that
        were never completed nor aborted."""
        return multipart.incomplete(self.client, self.url, self._checked)

    def abort_upload(self, key: str, upload: str) -> None:
        multipart.abort(self.client, self.url, key, upload)

    # --- errors -------------------------------------------------------------------------------

    def _checked(self, what: str, call: Callable[[], T], create: bool = False) -> T:
        """`retrying(call)`, with a refused precondition on a create as `KeyExists` and any other
        refusal as a `StoreError` that says what and where."""
        _, _, errors = _boto()
        try:
            return self.retrying(what, call)
        except errors.ClientError as exc:
            refused = status_of(exc) == 412 or code_of(exc) in ("PreconditionFailed", "ConditionalRequestConflict")
            if create and refused:
                raise KeyExists(f"{self.url.bucket}/{what.split(' ', 1)[-1]}: exists") from None
            if refused:
                raise Refused412(describe_refusal(exc, self.url, what)) from None
            if code_of(exc) == "NoSuchKey":
                raise ObjectMissing(describe_refusal(exc, self.url, what)) from None
            if code_of(exc) == "NoSuchUpload":
                raise UploadAborted(f"{self.url}: {what}: the upload was aborted meanwhile") from None
            raise StoreError(describe_refusal(exc, self.url, what)) from None
        except errors.NoCredentialsError:
            raise StoreError(
                f"{self.url}: no credentials: give --s3-credentials FILE, or set them as boto3 reads "
                "them (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, ~/.aws/credentials)"
            ) from None
        except errors.BotoCoreError as exc:
            raise StoreError(f"{self.url}: {what}: {type(exc).__name__}: {exc}") from None
