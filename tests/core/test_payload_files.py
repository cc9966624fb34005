"""A sample's payload file: written and hashed in one pass; pushed to the disk as it is written only
when it will be fsynced. A temporary file on its way to a bucket is read back once and deleted, so
write-back would spend the disk (and, on a GPU host, the bandwidth the object store's own server
writes with) on bytes nobody keeps."""

from __future__ import annotations

import hashlib

import pytest
from hsextract import durable

MIB = 1 << 20


class Payload:
    """What a format's encoder hands the writer: something that writes itself to a sink."""

    def __init__(self, pieces: int):
        self.pieces = [bytes([i]) * MIB for i in range(pieces)]

    def write_to(self, sink) -> None:
        for piece in self.pieces:
            sink.write(piece)


@pytest.fixture
def write_backs(monkeypatch):
    started: list[tuple[int, int]] = []
    monkeypatch.setattr(durable, "start_writeback", lambda fd, offset, length: started.append((offset, length)))
    return started


def test_a_file_that_will_be_fsynced_has_its_write_back_started_as_it_grows(tmp_path, write_backs):
    payload = Payload(32)
    n = durable.write_payload_durably(tmp_path / "s.tmp", payload, hashlib.sha256(), durable=True)
    assert n == 32 * MIB
    assert sum(length for _, length in write_backs) >= 32 * MIB - durable.WRITEBACK_STEP


def test_a_file_on_its_way_to_a_bucket_is_never_pushed_to_the_disk(tmp_path, write_backs):
    payload, hasher = Payload(32), hashlib.sha256()
    n = durable.write_payload_durably(tmp_path / "s.tmp", payload, hasher, durable=False)
    assert write_backs == []
    assert n == 32 * MIB and (tmp_path / "s.tmp").read_bytes() == b"".join(payload.pieces)
    assert hasher.hexdigest() == hashlib.sha256(b"".join(payload.pieces)).hexdigest()
