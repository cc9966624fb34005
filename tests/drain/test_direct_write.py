"""A sample's file written around the page cache holds exactly the payload's bytes, hashed once,
whatever the chunks' sizes, and on a filesystem that refuses direct writes too."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest
from hsextract import direct_write
from hsextract.direct_write import BLOCK, BUFFER, write_payload_direct
from hsextract.formats.base import ChunksPayload, SourceRange


def _payload(sizes: list[int], staged: list[int]) -> tuple[ChunksPayload, bytes]:
    """Chunks of `sizes`, then a staged range of pieces of `staged`; the payload and its bytes."""
    rng = __import__("random").Random(sum(sizes) + len(staged))
    chunks = [rng.randbytes(n) for n in sizes]
    pieces = [memoryview(rng.randbytes(n)) for n in staged]
    whole = b"".join(chunks) + b"".join(bytes(p) for p in pieces)
    body: list = [*chunks]
    if staged:
        body.append(SourceRange(sum(staged), iter(pieces)))
    return ChunksPayload(body), whole


@pytest.mark.parametrize(
    ("sizes", "staged"),
    [
        ([], []),
        ([7], []),
        ([BLOCK], []),
        ([100, BLOCK - 100, 1], [3 * BLOCK + 5, 17]),
        ([1 << 20, 3, BUFFER + 11], [BUFFER, BUFFER - 1, 9]),
    ],
)
def test_the_file_is_the_payload_and_its_hash_the_payloads(tmp_path, sizes, staged):
    payload, want = _payload(sizes, staged)
    hasher = hashlib.sha256()
    n = write_payload_direct(tmp_path / "s.tmp", payload, hasher)
    assert n == len(want)
    assert (tmp_path / "s.tmp").read_bytes() == want
    assert hasher.hexdigest() == hashlib.sha256(want).hexdigest()


def test_a_filesystem_refusing_direct_mode_at_open_gets_the_same_bytes_buffered(tmp_path, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *args):
        if flags & direct_write._O_DIRECT:
            raise OSError(errno.EINVAL, "no O_DIRECT here")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_direct)
    payload, want = _payload([5, BUFFER + 3], [BLOCK + 1])
    assert write_payload_direct(tmp_path / "s.tmp", payload, hashlib.sha256()) == len(want)
    assert (tmp_path / "s.tmp").read_bytes() == want


def test_a_filesystem_refusing_direct_writes_gets_the_same_bytes_buffered(tmp_path, monkeypatch):
    real_pwrite = os.pwrite
    refused = []

    def refuse_while_direct(fd, data, offset):
        if direct_write.fcntl.fcntl(fd, direct_write.fcntl.F_GETFL) & direct_write._O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "no direct writes here")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", refuse_while_direct)
    payload, want = _payload([BUFFER * 5 + 100], [BLOCK * 3 + 1])
    assert write_payload_direct(tmp_path / "s.tmp", payload, hashlib.sha256()) == len(want)
    assert (tmp_path / "s.tmp").read_bytes() == want
    assert refused  # refused, then the same bytes buffered to the end


def test_a_failed_write_in_flight_fails_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    real_pwrite = os.pwrite

    def full_at_the_second_buffer(fd, data, offset):
        if offset >= BUFFER:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", full_at_the_second_buffer)
    payload, _ = _payload([BUFFER * (direct_write.DEPTH + 3)], [])
    with pytest.raises(OSError) as caught:
        write_payload_direct(tmp_path / "s.tmp", payload, hashlib.sha256())
    assert caught.value.errno == errno.ENOSPC  # the drain then waits for space and writes the sample again
    assert not (tmp_path / "s.tmp").exists()


def test_a_failed_payload_leaves_no_file(tmp_path):
    def broken():
        yield memoryview(b"x" * BLOCK)
        raise OSError(errno.EIO, "the staged file went away")

    with pytest.raises(OSError, match="went away"):
        write_payload_direct(
            tmp_path / "s.tmp", ChunksPayload([b"head", SourceRange(2 * BLOCK, broken())]), hashlib.sha256()
        )
    assert not (tmp_path / "s.tmp").exists()
