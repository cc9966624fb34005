"""Several client processes on one host: the sub-shard of process j of P on host shard k/N."""

from __future__ import annotations

import re

import pytest
from hsextract.errors import ConfigError
from hsextract.shard import WHOLE, Shard, parse_process

# (k, N, P): the whole dataset, a fleet's first and last host, a P that shares factors with N.
CASES = [(0, 1, 1), (0, 1, 2), (0, 1, 8), (1, 2, 2), (0, 3, 4), (2, 3, 4), (3, 4, 6), (5, 8, 8)]


def _members(shard: Shard, rows: int) -> set[int]:
    return {x for x in range(rows) if shard.takes(x)}


@pytest.mark.parametrize(("k", "n", "p"), CASES)
def test_the_processes_sub_shards_are_disjoint(k, n, p):
    rows = 3 * n * p + 5
    taken: dict[int, int] = {}
    for j in range(p):
        for x in _members(Shard(k, n).sub_shard((j, p)), rows):
            assert x not in taken, f"index {x} is in the sub-shards of processes {taken[x]} and {j}"
            taken[x] = j


@pytest.mark.parametrize(("k", "n", "p"), CASES)
def test_the_processes_sub_shards_cover_the_host_shard_exactly(k, n, p):
    rows = 3 * n * p + 5
    union = set().union(*(_members(Shard(k, n).sub_shard((j, p)), rows) for j in range(p)))
    assert union == _members(Shard(k, n), rows)


def test_process_j_of_p_takes_every_pth_index_of_the_host_shard():
    # host 1 of 2 takes 1, 3, 5, 7, ...; its process 1 of 2 takes the second of each pair: 3, 7, 11
    assert Shard(1, 2).sub_shard((1, 2)) == Shard(3, 4)
    assert WHOLE.sub_shard((0, 1)) == WHOLE, "one process keeps the host's shard unchanged"


@pytest.mark.parametrize(
    ("process", "why"),
    [((2, 2), "0 <= j < P=2, got j=2"), ((-1, 2), "got j=-1"), ((0, 0), "P >= 1"), ((0, -3), "P >= 1")],
)
def test_a_process_out_of_range_is_refused_naming_the_bound(process, why):
    with pytest.raises(ConfigError, match="process") as exc:
        Shard(0, 2).sub_shard(process)
    assert why in str(exc.value)


@pytest.mark.parametrize("text", ["1", "a/b", "1/2/3", ""])
def test_a_malformed_process_is_refused_with_an_example(text):
    with pytest.raises(ConfigError, match=re.escape("expected j/P, e.g. 1/4")):
        parse_process(text)


def test_a_well_formed_process_is_read_as_index_and_count():
    assert parse_process("3/8") == (3, 8)
    with pytest.raises(ConfigError, match="P >= 1"):
        parse_process("0/0")
