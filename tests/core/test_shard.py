"""A shard i/n is one value with one owner, hsextract.shard.Shard: parsed, tested and written in one place."""

from __future__ import annotations

import json
import re

import pytest
from hsextract.errors import ConfigError
from hsextract.output import layout
from hsextract.shard import WHOLE, Shard


def test_i_of_n_is_read_as_index_and_count():
    assert Shard.parse("2/5") == Shard(2, 5)
    assert Shard.parse("0/1") == WHOLE


@pytest.mark.parametrize("text", ["half", "1/2/3", "", "1/", "a/b", "1-2"])
def test_text_that_is_not_i_of_n_is_refused_with_an_example(text):
    with pytest.raises(ConfigError, match=re.escape(f"shard {text!r}: expected i/n, e.g. 0/4 for the first")):
        Shard.parse(text)


@pytest.mark.parametrize("text", ["4/4", "1/0", "-1/2", "0/-1"])
def test_a_shard_that_cannot_exist_is_refused_naming_the_bound(text):
    with pytest.raises(ConfigError, match=re.escape(f"shard {text!r}: need 0 <= i < n")):
        Shard.parse(text)


def test_a_parse_error_says_where_the_shard_came_from():
    with pytest.raises(ConfigError, match=re.escape("host b: shard '3/2': need 0 <= i < n")):
        Shard.parse("3/2", where="host b")
    with pytest.raises(ConfigError, match=re.escape("--shard: shard 'x': expected i/n")):
        Shard.parse("x", where="--shard")


@pytest.mark.parametrize(("index", "count"), [(2, 2), (0, 0), (-1, 3)])
def test_a_shard_that_cannot_exist_cannot_be_constructed(index, count):
    with pytest.raises(ConfigError, match="need 0 <= i < n"):
        Shard(index, count)


def test_a_shard_takes_exactly_the_indices_congruent_to_its_index():
    assert [x for x in range(12) if Shard(1, 4).takes(x)] == [1, 5, 9]
    assert all(WHOLE.takes(x) for x in range(12))


@pytest.mark.parametrize(
    ("shard", "rows", "size"),
    [(Shard(1, 4), 12, 3), (Shard(1, 4), 10, 3), (Shard(3, 4), 3, 0), (Shard(0, 3), 0, 0), (WHOLE, 7, 7)],
)
def test_the_size_is_how_many_of_the_rows_the_shard_takes(shard, rows, size):
    assert shard.size(rows) == size == sum(shard.takes(x) for x in range(rows))


def test_a_shard_reads_as_i_of_n_and_parses_back():
    assert str(Shard(3, 8)) == "3/8"
    assert Shard.parse(str(Shard(3, 8))) == Shard(3, 8)


def test_json_files_keep_a_shard_as_the_list_i_n_and_read_it_back():
    text = json.dumps({"shard": Shard(1, 3).to_json()})
    assert text == '{"shard": [1, 3]}'
    assert Shard.from_json(json.loads(text)["shard"]) == Shard(1, 3)


def test_a_shard_written_as_i_of_n_in_a_json_file_reads_too():
    assert Shard.from_json("1/3") == Shard(1, 3)  # the regeneration's settings and plan reports


@pytest.mark.parametrize("value", [[1], [1, 2, 3], ["1", "2"], [True, 2], {"i": 1}, None, [3, 2]])
def test_a_json_shard_of_another_form_is_refused(value):
    with pytest.raises(ConfigError, match="shard"):
        Shard.from_json(value)


def test_file_names_tag_a_shard_as_before():
    assert layout.client_summary_path("o", Shard(1, 4)).name == "client-summary.shard-1-of-4.json"
    assert layout.client_summary_path("o", WHOLE).name == "client-summary.json"
    assert layout.client_file_shard("rejects.shard-1-of-4.jsonl", layout.REJECTS) == Shard(1, 4)
    assert layout.client_file_shard("rejects.jsonl", layout.REJECTS) == WHOLE


def test_a_file_name_of_a_shard_that_cannot_exist_is_no_client_file():
    assert layout.client_file_shard("rejects.shard-3-of-2.jsonl", layout.REJECTS) is None


def test_shards_sort_and_key_as_index_then_count():
    assert sorted([Shard(1, 2), Shard(0, 4), Shard(0, 2)]) == [Shard(0, 2), Shard(0, 4), Shard(1, 2)]
    assert {Shard(1, 2): "b"}[Shard.parse("1/2")] == "b"


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [(WHOLE, Shard(1, 2), True), (Shard(1, 2), Shard(2, 4), False), (Shard(0, 2), Shard(1, 3), True)],
)
def test_two_shards_overlap_when_some_index_is_in_both(a, b, overlap):
    assert a.overlaps(b) is overlap is any(a.takes(x) and b.takes(x) for x in range(24))


@pytest.mark.parametrize(
    ("a", "b", "contains"),
    [
        (WHOLE, Shard(1, 3), True),
        (Shard(1, 3), WHOLE, False),
        (Shard(0, 2), Shard(2, 4), True),  # a sub-shard of client process 1 of 2 of host shard 0/2
        (Shard(0, 2), Shard(1, 4), False),
        (Shard(0, 2), Shard(0, 3), False),  # overlapping, not inside
        (Shard(1, 3), Shard(1, 3), True),
    ],
)
def test_a_shard_contains_another_when_every_index_of_it_is_its_own(a, b, contains):
    assert all(a.takes(x) for x in b.indices(60)) is contains, "the table itself"
    assert a.contains(b) is contains
