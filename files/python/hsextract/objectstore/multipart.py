"""Uploads in parts (S3's multipart API), for the object store's large files (hsextract.objectstore.store).

A file of two parts or more goes up in parts of the store's part size, read from the file one
part at a time, several at once where the caller gives a pool; the upload is completed with
``If-None-Match: *`` when it must create the object. An upload that fails is aborted, so no part
lingers; one the server cannot abort (it is down) is never an object, and a bucket lifecycle rule
removes it. Every request goes through the store's `checked` (its retries and its errors).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hsextract.objectstore.url import ObjectURL

log = logging.getLogger("hsextract.objectstore")

# ObjectStore._checked: (what, call, create=False) -> call()'s result, retried, its refusals named.
Checked = Callable[..., Any]


def put_in_parts(
    client: Any,
    url: ObjectURL,
    key: str,
    path: Path,
    size: int,
    part_size: int,
    create_only: bool,
    metadata: dict[str, str],
    part_pool: Any,
    checked: Checked,
) -> str:
    """Upload `path` (`size` bytes) to `key` in parts; its ETag."""
    bucket = url.bucket
    upload = checked(
        f"start the multipart upload of {key}",
        lambda: client.create_multipart_upload(Bucket=bucket, Key=key, Metadata=metadata),
    )["UploadId"]
    try:
        ranges = [(n + 1, off, min(part_size, size - off)) for n, off in enumerate(range(0, size, part_size))]

        def part(spec: tuple[int, int, int]) -> dict[str, Any]:
            number, off, length = spec
            with open(path, "rb") as f:
                f.seek(off)
                data = f.read(length)
            r = checked(
                f"part {number} of {key}",
                lambda: client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=data),
            )
            done = {"PartNumber": number, "ETag": r["ETag"]}
            if r.get("ChecksumCRC32"):
                done["ChecksumCRC32"] = r["ChecksumCRC32"]
            return done

        parts = list(part_pool.map(part, ranges)) if part_pool is not None else [part(r) for r in ranges]
        kw: dict[str, Any] = {"Bucket": bucket, "Key": key, "UploadId": upload, "MultipartUpload": {"Parts": parts}}
        if create_only:
            kw["IfNoneMatch"] = "*"
        r = checked(
            f"complete the multipart upload of {key}",
            lambda: client.complete_multipart_upload(**kw),
            create=create_only,
        )
    except BaseException:
        abort(client, url, key, upload)
        raise
    return str(r.get("ETag", ""))


def abort(client: Any, url: ObjectURL, key: str, upload: str) -> None:
    """Abort an upload; a server that does not answer leaves it lingering, said in the log."""
    try:
        client.abort_multipart_upload(Bucket=url.bucket, Key=key, UploadId=upload)
    except Exception as exc:  # the server may be down: the upload lingers, never an object
        log.warning(
            "could not abort the multipart upload of %s (%s); an incomplete upload is never an object, "
            "and a bucket lifecycle rule (AbortIncompleteMultipartUpload) removes it",
            key,
            type(exc).__name__,
        )


def incomplete(client: Any, url: ObjectURL, checked: Checked) -> list[tuple[str, str, float]]:
    """(key, upload id, when the server began it) of the multipart uploads under the prefix that
    were never completed nor aborted."""
    full = url.prefix + "/" if url.prefix else ""
    out: list[tuple[str, str, float]] = []
    marker: dict[str, Any] = {}
    while True:
        r: dict[str, Any] = checked(
            "LIST uploads",
            functools.partial(client.list_multipart_uploads, Bucket=url.bucket, Prefix=full, **marker),
        )
        out += [
            (u["Key"], u["UploadId"], u["Initiated"].timestamp() if u.get("Initiated") else 0.0)
            for u in r.get("Uploads") or []
        ]
        if not r.get("IsTruncated"):
            return out
        marker = {"KeyMarker": r.get("NextKeyMarker", ""), "UploadIdMarker": r.get("NextUploadIdMarker", "")}
