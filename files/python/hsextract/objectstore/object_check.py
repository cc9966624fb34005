"""Is the object a manifest segment names that line's sample? What a bucket's server can tell
without a byte of the object read.

A segment's line names a sample's object by key, with its size and checksum. The object itself
carries the line its writer stored with it (its metadata, hsextract.objectstore.committer), and
the server reports its size and ETag; the line records the ETag the server reported when the
sample was confirmed. So, from a HEAD alone:

* the object exists;
* it carries a manifest line of hsextract's (an object replaced by anything else does not), and
  that line is of the same sample: the same output index, file (its own key), dataset index,
  rid, tokens, size, checksum and fingerprint. An object copied under another sample's key
  carries the other sample's line;
* it has the line's size;
* its ETag is the one recorded when it was written (where the line recorded one: sets drained
  before hsextract recorded ETags have none). An object re-uploaded since, even with its
  metadata copied and its size kept, has another ETag.

What passes is the object that was written, unless the server itself lies; reading every byte is
``hsextract finalize --verify``'s work, and `hsextract pull`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from hsextract.objectstore.committer import entry_of
from hsextract.objectstore.store import ObjectInfo
from hsextract.output.manifest import ManifestEntry

# What names a sample, and what its writer measured of it: a stored line and a segment's line of
# one sample agree on all of these.
IDENTITY = ("output_index", "file", "dataset_index", "rid", "tokens", "bytes", "checksum", "fingerprint")


@dataclass(frozen=True)
class ObjectProblem:
    """Why an object is not its line's sample: a reason word (missing, size, no_metadata,
    wrong_sample, changed) and a sentence that says what and where."""

    reason: str
    detail: str


def plain_etag(etag: str) -> str:
    return etag.strip().strip('"')


def object_problem(info: ObjectInfo | None, entry: ManifestEntry, where: str) -> ObjectProblem | None:
    """None when the object `info` (a HEAD of `where`, None: no object) is `entry`'s sample as far
    as the server tells (see the module docstring), else what is wrong."""
    if info is None:
        return ObjectProblem("missing", f"{where}: missing")
    stored = entry_of(info.metadata)
    if stored is None:
        return ObjectProblem(
            "no_metadata",
            f"{where}: carries no manifest line of hsextract's: it was replaced since its drain wrote it, "
            "so nothing tells that its bytes are the sample's",
        )
    differ = [f for f in IDENTITY if getattr(stored, f) != getattr(entry, f)]
    if differ:
        return ObjectProblem(
            "wrong_sample",
            f"{where}: the manifest line stored with the object is of another sample ("
            + ", ".join(f"{f} {getattr(stored, f)!r}, not {getattr(entry, f)!r}" for f in differ[:3])
            + ")",
        )
    if info.size != entry.bytes:
        return ObjectProblem("size", f"{where}: {info.size} bytes, its manifest line says {entry.bytes}")
    if entry.etag and plain_etag(info.etag) != plain_etag(entry.etag):
        return ObjectProblem(
            "changed",
            f"{where}: its ETag is {plain_etag(info.etag)}, {plain_etag(entry.etag)} when its sample was written: "
            "the object was replaced since",
        )
    return None
