"""Before anything is sent: the server is S3, the credentials and the bucket work, and the server
honours conditional writes.

The drain's exactly-once rests on one promise of the server: a create with ``If-None-Match: *``
of a key that exists is refused (412). Manifest segments, the run's identity and every sample
object are created that way (hsextract.objectstore.segments). A server that ignores the header
lets two writers both "create" one key, the last silently replacing the first, and a second
drain on a prefix would overwrite the first one's samples without either noticing. So the drain
proves the promise at start with a canary key of its own, created twice; a server whose second
create succeeds is refused, with a sentence saying why. Servers known either way:
docs/object-store.md.
"""

from __future__ import annotations

import contextlib
import secrets

from hsextract.objectstore.store import KeyExists, ObjectStore, StoreError, code_of, describe_refusal, status_of

CANARY_DIR = ".hsextract/canary"


class ServerRefused(StoreError):
    """The server cannot hold a training set safely (not S3, or it ignores conditional writes)."""


def check_access(store: ObjectStore) -> None:
    """One listing of the prefix: StoreError naming the cause unless the server is S3, the bucket
    exists and the credentials may read it (a server down is waited for)."""
    import botocore.exceptions as errors

    url = store.url
    try:
        r = store.retrying(
            "LIST bucket", lambda: store.client.list_objects_v2(Bucket=url.bucket, Prefix=url.key(""), MaxKeys=1)
        )
    except errors.ClientError as exc:
        code = code_of(exc)
        if code.isdigit():  # an error without S3's XML body: some other HTTP server answered
            raise ServerRefused(
                f"{url}: the endpoint {store.settings.endpoint or '(boto3 default)'} answered HTTP {status_of(exc)} "
                "without an S3 error: it is not an S3 server (check --s3-endpoint)"
            ) from None
        raise StoreError(describe_refusal(exc, url, "LIST bucket")) from None
    except errors.ResponseParserError:
        raise ServerRefused(
            f"{url}: the endpoint {store.settings.endpoint or '(boto3 default)'} answered with "
            "something that is not S3's XML: it is not an S3 server (check --s3-endpoint)"
        ) from None
    except errors.NoCredentialsError:
        raise StoreError(
            f"{url}: no credentials: give --s3-credentials FILE, or set them as boto3 reads them "
            "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, ~/.aws/credentials)"
        ) from None
    if not isinstance(r, dict) or r.get("Name") != url.bucket:
        raise ServerRefused(
            f"{url}: the endpoint {store.settings.endpoint or '(boto3 default)'} answered a listing "
            "of the bucket without S3's ListBucketResult: it is not an S3 server (check --s3-endpoint)"
        )


def check_conditional_writes(store: ObjectStore) -> None:
    """Create a canary key twice with ``If-None-Match: *``: the second must be refused (412).
    ServerRefused, saying why, when it is not; the canary is removed either way."""
    key = store.url.key(f"{CANARY_DIR}/{secrets.token_hex(8)}")
    try:
        try:
            store.put_bytes(key, b"first", create_only=True)
        except KeyExists:
            # A random key: the first create was applied, its answer lost (a reset, a timeout), and
            # its retry refused. That refusal is the promise.
            return
        try:
            store.put_bytes(key, b"second", create_only=True)
        except KeyExists:
            return
        raise ServerRefused(
            f"{store.url}: the server ignores conditional writes: a second create of {key} with If-None-Match: * "
            "succeeded instead of being refused (412). hsextract publishes the manifest and every sample as "
            "create-only objects, so on such a server two drains of one prefix would overwrite each other's "
            "samples without either noticing; use a server that honours If-None-Match (AWS S3, MinIO, SeaweedFS: "
            "docs/object-store.md)"
        )
    finally:
        with contextlib.suppress(StoreError):
            store.delete(key)


def check_store(store: ObjectStore) -> None:
    """`check_access`, then `check_conditional_writes`: everything a writer proves before it writes."""
    check_access(store)
    check_conditional_writes(store)
