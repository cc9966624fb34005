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
    from botocore.parsers import ResponseParserError  # not in botocore.exceptions

    url = store.url
    endpoint = store.settings.endpoint or "(boto3 default)"
    malformed = MalformedAnswers()

    def listing() -> dict:
        malformed.last = False
        try:
            return store.client.list_objects_v2(Bucket=url.bucket, Prefix=url.key(""), MaxKeys=1)
        except errors.ClientError:
            malformed.seen = malformed.seen + 1 if malformed.last else 0
            if malformed.seen >= MALFORMED_TRIES:
                raise ServerRefused(
                    f"{url}: the endpoint {endpoint} answered the listing {malformed.seen} times in a row with a "
                    f"whole body that is not well-formed XML ({malformed.sample!r}...): it is not an S3 server, or "
                    "not one that speaks S3's XML (check --s3-endpoint)"
                ) from None
            raise

    store.client.meta.events.register(_LIST_PARSE, malformed.look)
    try:
        r = store.retrying("LIST bucket", listing)
    except errors.ClientError as exc:
        code = code_of(exc)
        if code.isdigit():  # an error without S3's XML body: some other HTTP server answered
            raise ServerRefused(
                f"{url}: the endpoint {endpoint} answered HTTP {status_of(exc)} "
                "without an S3 error: it is not an S3 server (check --s3-endpoint)"
            ) from None
        raise StoreError(describe_refusal(exc, url, "LIST bucket")) from None
    except ResponseParserError:
        raise ServerRefused(
            f"{url}: the endpoint {endpoint} answered with "
            "something that is not S3's XML: it is not an S3 server (check --s3-endpoint)"
        ) from None
    except errors.NoCredentialsError:
        raise StoreError(
            f"{url}: no credentials: give --s3-credentials FILE, or set them as boto3 reads them "
            "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, ~/.aws/credentials)"
        ) from None
    finally:
        store.client.meta.events.unregister(_LIST_PARSE, malformed.look)
    if not isinstance(r, dict) or r.get("Name") != url.bucket:
        raise ServerRefused(
            f"{url}: the endpoint {endpoint} answered a listing "
            "of the bucket without S3's ListBucketResult: it is not an S3 server (check --s3-endpoint)"
        )


_LIST_PARSE = "before-parse.s3.ListObjectsV2"
# Whole answers of malformed XML in a row before the start check calls the server "not S3": botocore
# takes such an answer for a response cut short by the network (a 500, retried), so one is no proof.
MALFORMED_TRIES = 3


class MalformedAnswers:
    """Whether the listing's last answer arrived whole (as long as its Content-Length says) and
    claims to be XML, but is not well-formed: what a server that is not S3 sends, where a network
    fault cuts a body short of its length. botocore calls both a 500 and retries them. `seen`:
    such answers to the listings in a row (counted by the caller)."""

    def __init__(self) -> None:
        self.seen = 0
        self.last = False
        self.sample = ""

    def look(self, response_dict: dict, **_: object) -> None:
        body = response_dict.get("body") or b""
        headers = response_dict.get("headers") or {}
        length = str(headers.get("content-length", ""))
        xml_like = "xml" in str(headers.get("content-type", "")) or body.lstrip().startswith(b"<?xml")
        if not (isinstance(body, bytes) and xml_like and length == str(len(body)) and not _well_formed(body)):
            return
        self.last = True
        self.sample = body[:60].decode("utf-8", "replace")


def _well_formed(body: bytes) -> bool:
    from xml.etree import ElementTree

    try:
        ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return False
    return True


def check_conditional_writes(store: ObjectStore) -> None:
    """Create a canary key twice with ``If-None-Match: *``: the second must be refused (412).
    ServerRefused, saying why, when it is not; the canary is removed either way."""
    key = store.url.key(f"{CANARY_DIR}/{secrets.token_hex(8)}")
    store.put_bytes(key, b"first", create_only=True)
    try:
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
