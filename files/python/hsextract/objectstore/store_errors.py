"""What can go wrong with a request to a bucket, as exceptions and sentences a caller can act on
(hsextract.objectstore.store raises them, and re-exports them for its callers)."""

from __future__ import annotations

from hsextract.errors import HsextractError
from hsextract.objectstore.url import ObjectURL
from hsextract.output.target import TargetUnreachable


class StoreError(HsextractError):
    """The object store refused or failed a request in a way waiting will not fix."""


class KeyExists(StoreError):
    """A create with If-None-Match met a key that exists."""


class ObjectMissing(StoreError):
    """A request named an object that does not exist (NoSuchKey): a copy's source, say."""


class SourceChanged(StoreError):
    """A server-side copy was refused because its source no longer has the ETag it was checked with."""


class UploadAborted(StoreError):
    """A multipart upload was aborted under this writer (by a newer writer that fenced it)."""


class RequestFailed(StoreError):
    """The server answered one request with a failure at every one of its attempts."""


class Refused412(StoreError):
    """A condition of a request that is no create was refused (412): `ObjectStore.copy` tells what."""


class Stopped(TargetUnreachable):
    """The caller was stopped while the server was unreachable."""


class Unreachable(Stopped):
    """The server does not answer, and the caller would rather come back later than wait."""


def status_of(exc: BaseException) -> int:
    """The HTTP status of a botocore ClientError (0 for anything else)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return 0
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def code_of(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def describe_refusal(exc: BaseException, url: ObjectURL, what: str) -> str:
    """A refusal as a sentence a user can act on (the server's code, never a credential)."""
    status, code = status_of(exc), code_of(exc)
    if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return (
            f"{url}: the server refused the credentials ({code or status} on {what}): check the access key and "
            "secret (--s3-credentials, or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) and that they may write "
            "the bucket"
        )
    if code == "NoSuchBucket" or (status == 404 and what.startswith(("HEAD bucket", "LIST"))):
        return f"{url}: the bucket {url.bucket!r} does not exist on this server: create it, or check --output"
    return f"{url}: {what}: the server answered {status} {code}: {str(exc)[:300]}"
