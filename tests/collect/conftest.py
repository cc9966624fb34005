"""Fleets of host outputs written by the real drain, built once per format and test session.

Tests that change a host output work on a copy (`Fleet.copy`); the others read the shared one.
"""

from __future__ import annotations

import pytest
from hsextract.cli import main
from support.fleet import Fleet, make_fleet, three_hosts

LINES = 30


@pytest.fixture(scope="session")
def fleets(tmp_path_factory):
    """fleets(fmt): three hosts with shards 0/3, 1/3, 2/3 of a 30-line dataset, each with a rejected,
    failed or quarantined sample."""
    built: dict[str, Fleet] = {}

    def get(fmt: str) -> Fleet:
        if fmt not in built:
            built[fmt] = make_fleet(tmp_path_factory.mktemp(f"fleet-{fmt}"), fmt, three_hosts(), LINES)
        return built[fmt]

    return get


@pytest.fixture
def collect(capsys):
    """collect(*args) -> (exit status, what it printed on stderr): ``hsextract collect`` in this process."""

    def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(["collect", "--draft-vocab-size", "16", "64", *args])
        return code, capsys.readouterr().err

    return run
