"""``s3://bucket/prefix``: where a training set lives in an object store, and its keys.

A set's keys are ``<prefix>/<path in the set>``, exactly the paths of a local output directory
(the trainer's layout), so a pulled set is a directory every reader loads as it loads a local one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hsextract.errors import ConfigError

SCHEME = "s3://"
# S3's rules for bucket names (3-63 characters of lower-case letters, digits, dots and hyphens).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")


# Where a bucket output's local bookkeeping lives when --work-dir does not say.
DEFAULT_WORK_ROOT = "/var/lib/hsextract/objectstore"


def is_object_url(value: object) -> bool:
    """Whether an ``--output`` names an object store rather than a directory."""
    return isinstance(value, str) and value.startswith(SCHEME)


@dataclass(frozen=True)
class ObjectURL:
    """A bucket and a key prefix (no leading or trailing slash; "" is the whole bucket)."""

    bucket: str
    prefix: str

    def key(self, rel: str) -> str:
        """The key of a path inside the set."""
        rel = rel.lstrip("/")
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def rel(self, key: str) -> str:
        """The path inside the set of one of its keys."""
        if not self.prefix:
            return key
        if not key.startswith(self.prefix + "/"):
            raise ValueError(f"key {key!r} is not under {self}")
        return key[len(self.prefix) + 1 :]

    def child(self, name: str) -> ObjectURL:
        """The set at ``<this prefix>/<name>`` (a host's set under a run's prefix)."""
        return ObjectURL(self.bucket, self.key(name).rstrip("/"))

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"


def parse_object_url(value: str, what: str = "--output") -> ObjectURL:
    """``s3://bucket/prefix`` parsed; ConfigError saying what is wrong otherwise."""
    if not is_object_url(value):
        raise ConfigError(f"{what} {value!r}: an object store is named s3://bucket/prefix")
    rest = value[len(SCHEME) :]
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if not _BUCKET.fullmatch(bucket):
        raise ConfigError(
            f"{what} {value!r}: {bucket!r} is not a valid bucket name (3-63 characters: lower-case "
            "letters, digits, dots, hyphens)"
        )
    if "//" in prefix or any(part in (".", "..") for part in prefix.split("/")):
        raise ConfigError(f"{what} {value!r}: the prefix may not hold empty, '.' or '..' parts")
    return ObjectURL(bucket, prefix)


def work_dir_for(url: ObjectURL, work_dir: str | None = None) -> str:
    """The local work directory of a bucket output: `work_dir`, else one of its own under DEFAULT_WORK_ROOT."""
    return str(work_dir) if work_dir else f"{DEFAULT_WORK_ROOT}/{url.bucket}/{url.prefix or '_bucket'}"
