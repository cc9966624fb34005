"""The S3 server of the object-store tests: one ``weed mini`` per test session (support.s3_server).

Each test takes a bucket of its own (`bucket`), so tests share the server and never each other's
keys. A test that stops the server takes its own (`own_weed`); one that wants the server to
misbehave reaches it through `faulty` (support.faulty_store).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.faulty_store import FaultyStore
from support.s3_server import WeedServer, free_ports


@pytest.fixture(scope="session")
def weed(tmp_path_factory) -> Iterator[WeedServer]:
    server = WeedServer(tmp_path_factory.mktemp("weed") / "data").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_weed(tmp_path) -> Iterator[WeedServer]:
    server = WeedServer(tmp_path / "weed-data").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(weed) -> str:
    weed.ensure_answering()
    return weed.new_bucket()


@pytest.fixture
def credentials(weed, tmp_path) -> Path:
    return weed.credentials_file(tmp_path / "s3.credentials")


@pytest.fixture
def faulty(weed) -> Iterator[FaultyStore]:
    """A proxy in front of the session's server that injects the faults a test asks for."""
    proxy = FaultyStore(weed.endpoint, free_ports(1)[0]).start()
    try:
        yield proxy
    finally:
        proxy.stop()
