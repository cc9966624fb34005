"""Every dataset shape users have reads into the same samples, indexed by file order then row, and
every unreadable part of a file is a reject that names the file and the row; nothing stops the reader."""

from __future__ import annotations

import gzip
import io
import json
import logging
import subprocess
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hsextract.dataset import reader as ds
from hsextract.dataset import sources
from hsextract.dataset.reader import Message, Reject, Sample, ToolCall, count_rows, read_dataset
from hsextract.errors import HsextractError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROWS = [
    {
        "id": "a",
        "conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello, [friend]!"}],
    },
    {
        "id": "b",
        "messages": [
            {"role": "user", "content": 'Quote "this", \\ and }{ ]['},
            {"role": "assistant", "content": "Done: caf\u00e9 \u4f60\u597d \U0001f600"},
        ],
    },
    {"input_ids": [1, 5, 9], "loss_mask": [0, 1, 1]},
    {
        "id": 7,
        "messages": [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
            {"role": "assistant", "content": "Sunny.", "thinking": "The tool said so."},
        ],
        "tools": json.dumps([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]),
    },
]


def _jsonl(rows) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _summary(items):
    """What a sample carries, comparable across file shapes."""
    out = []
    for it in items:
        if isinstance(it, Reject):
            out.append(("reject", it.index, it.reason))
        elif it.is_tokenized:
            out.append(("tokens", it.index, it.input_ids, it.loss_mask))
        else:
            out.append(("conv", it.index, it.id, it.messages, it.tools))
    return out


def _expected(tmp_path):
    """What the plain JSONL file of ROWS reads as: every other shape must read the same."""
    path = tmp_path / "plain" / "plain.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(_jsonl(ROWS))
    return _summary(read_dataset(path))


def test_plain_jsonl_reads_every_shape_with_ids_tools_and_reasoning(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(_jsonl(ROWS))
    items = list(read_dataset(path))
    assert [type(i).__name__ for i in items] == ["Sample"] * 4
    assert [i.id for i in items] == ["a", "b", None, "7"]
    tool_sample = items[3]
    call = ToolCall("get_weather", {"city": "Paris"}, "c1")
    assert tool_sample.messages[1] == Message("assistant", "", None, (call,))
    assert tool_sample.messages[2] == Message("tool", "sunny", tool_call_id="c1")
    assert tool_sample.messages[3].reasoning_content == "The tool said so."
    assert tool_sample.tools == ({"type": "function", "function": {"name": "get_weather", "parameters": {}}},)


@pytest.mark.parametrize("block", [1, 3, 7, 1 << 20])
def test_json_array_is_streamed_element_by_element_across_any_block_boundary(tmp_path, monkeypatch, block):
    monkeypatch.setattr(sources, "BLOCK", block)
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(ROWS, indent=2, ensure_ascii=False))
    items = list(read_dataset(path))
    assert _summary(items) == _expected(tmp_path)
    assert [(i.file, i.row) for i in items] == [("sharegpt.json", r) for r in range(4)]
    assert count_rows(path) == 4


def test_json_array_reader_holds_a_few_blocks_not_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "BLOCK", 1 << 16)
    row = json.dumps(
        {
            "messages": [
                {"role": "user", "content": "q, [x] {y} " * 300},
                {"role": "assistant", "content": 'a \\ " ' * 500},
            ]
        }
    )
    path = tmp_path / "big.json"
    path.write_text("[" + ",".join([row] * 700) + "]")  # ~5 MB
    tracemalloc.start()
    try:
        n = sum(1 for _ in sources.iter_rows(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == 700
    assert peak < 8 * sources.BLOCK, f"peak {peak} bytes for a {path.stat().st_size} byte file"


def test_bad_element_of_an_array_is_one_reject_and_the_next_is_read(tmp_path):
    path = tmp_path / "d.json"
    path.write_bytes(
        b"[" + json.dumps(ROWS[0]).encode() + b', {"messages": [}, ,' + json.dumps(ROWS[1]).encode() + b', "\xff"]'
    )
    items = list(read_dataset(path))
    assert [(type(i).__name__, getattr(i, "reason", "")) for i in items] == [
        ("Sample", ""),
        ("Reject", ds.MALFORMED_JSON),
        ("Reject", ds.BLANK_LINE),
        ("Sample", ""),
        ("Reject", ds.NOT_UTF8),
    ]
    assert [i.to_json()["line"] for i in items if isinstance(i, Reject)] == [2, 3, 5]
    assert count_rows(path) == 5


@pytest.mark.parametrize(
    ("text", "outcomes"),
    [
        (b"[]", []),
        (b"  [ ]  \n", []),
        (b'[{"input_ids": [1]}', [("Sample", ""), ("Reject", ds.MALFORMED_JSON)]),  # not closed: truncated
        (b'[{"input_ids": [1]}] [', [("Sample", ""), ("Reject", ds.MALFORMED_JSON)]),  # data after the end
        (b'[{"input_ids": [1]},]', [("Sample", ""), ("Reject", ds.BLANK_LINE)]),
    ],
)
def test_array_edges_each_give_a_row_or_none(tmp_path, text, outcomes):
    path = tmp_path / "d.json"
    path.write_bytes(text)
    items = list(read_dataset(path))
    assert [(type(i).__name__, getattr(i, "reason", "")) for i in items] == outcomes
    assert count_rows(path) == len(outcomes)


def test_json_file_of_lines_is_read_as_lines(tmp_path):
    path = tmp_path / "lines.json"
    path.write_bytes(_jsonl(ROWS))
    assert _summary(read_dataset(path)) == _expected(tmp_path)


@pytest.mark.parametrize("name", ["d.jsonl", "d.json"])
def test_first_line_after_a_byte_order_mark_is_not_lost(tmp_path, name):
    path = tmp_path / name
    body = _jsonl(ROWS) if name.endswith("l") else json.dumps(ROWS).encode()
    path.write_bytes(sources.BOM + body)
    assert _summary(read_dataset(path)) == _expected(tmp_path)


@pytest.mark.parametrize("name", ["d.jsonl", "d.json", "d.jsonl.gz"])
def test_a_file_of_only_a_byte_order_mark_counts_the_rows_it_yields(tmp_path, name):
    data = sources.BOM
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    assert count_rows(path) == len(list(read_dataset(path))) == 0


def _zst(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


@pytest.mark.parametrize(
    ("name", "pack"), [("d.jsonl.gz", gzip.compress), ("d.jsonl.zst", _zst), ("d.json.gz", gzip.compress)]
)
def test_compressed_files_read_like_plain_ones(tmp_path, name, pack):
    path = tmp_path / name
    body = json.dumps(ROWS).encode() if ".json." in name else _jsonl(ROWS)
    path.write_bytes(pack(body))
    assert _summary(read_dataset(path)) == _expected(tmp_path)
    assert count_rows(path) == 4


def test_truncated_gzip_keeps_the_lines_before_the_damage_and_rejects_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "BLOCK", 64)
    path = tmp_path / "d.jsonl.gz"
    path.write_bytes(gzip.compress(_jsonl(ROWS * 30))[:-200])
    items = list(read_dataset(path))
    assert items[-1].reason == sources.UNREADABLE_FILE and "d.jsonl.gz" in items[-1].detail
    good = [i for i in items if isinstance(i, Sample)]
    assert len(good) > 0 and all(i.index == n for n, i in enumerate(items))
    assert len(items) == count_rows(path)


def _numbered_rows(n: int) -> bytes:
    return b"".join(
        json.dumps(
            {
                "id": f"r{i}",
                "messages": [
                    {"role": "user", "content": f"Question {i}?"},
                    {"role": "assistant", "content": f"Answer {i}."},
                ],
            }
        ).encode()
        + b"\n"
        for i in range(n)
    )


def _complete_lines_recovered(tool: list[str], path) -> list[bytes]:
    """What the codec's own tool recovers from a damaged file, cut to its complete lines."""
    out = subprocess.run([*tool, str(path)], capture_output=True).stdout
    return out[: out.rfind(b"\n") + 1].splitlines()


@pytest.mark.parametrize(
    ("rows", "name", "pack", "tool"),
    [
        (40_000, "big.jsonl.gz", gzip.compress, ["zcat"]),
        (154, "small.jsonl.gz", gzip.compress, ["zcat"]),
        (40_000, "big.jsonl.zst", lambda b: zstandard.ZstdCompressor().compress(b), ["zstd", "-dc"]),
    ],
)
def test_a_compressed_file_cut_in_half_gives_every_complete_row_before_the_cut_and_one_reject_for_the_rest(
    tmp_path, rows, name, pack, tool
):
    packed = pack(_numbered_rows(rows))
    path = tmp_path / name
    path.write_bytes(packed[: len(packed) // 2])
    recovered = _complete_lines_recovered(tool, path)
    assert len(recovered) > 0
    items = list(read_dataset(path))
    assert [json.loads(line)["id"] for line in recovered] == [i.id for i in items[:-1]]
    assert all(isinstance(i, Sample) for i in items[:-1])
    lost = items[-1]
    assert lost.reason == sources.UNREADABLE_FILE and lost.line == len(recovered) + 1
    assert f"{name}: cannot read past line {len(recovered)}" in lost.detail
    assert "how many is unknown" in lost.detail
    assert count_rows(path) == len(items)


def test_gzip_members_and_the_zero_padding_after_them_read_like_one_file(tmp_path):
    path = tmp_path / "d.jsonl.gz"
    path.write_bytes(gzip.compress(_jsonl(ROWS[:2])) + gzip.compress(_jsonl(ROWS[2:])) + b"\0" * 512)
    assert _summary(read_dataset(path)) == _expected(tmp_path)


def test_zstd_without_the_package_says_so(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_zstd(name, *a, **k):
        if name == "zstandard":
            raise ImportError("no zstandard")
        return real_import(name, *a, **k)

    path = tmp_path / "d.jsonl.zst"
    path.write_bytes(_zst(_jsonl(ROWS)))
    monkeypatch.setattr(builtins, "__import__", no_zstd)
    with pytest.raises(HsextractError, match="zstandard package is not installed"):
        read_dataset(path)


def _table() -> pa.Table:
    # a table has one schema: every row has every column, null where the row has none
    keys = sorted({k for r in ROWS for k in r})
    rows = [{k: (str(r[k]) if k == "id" and k in r else r.get(k)) for k in keys} for r in ROWS]  # one type a column
    return pa.Table.from_pylist(rows[:2] + rows[3:] + [rows[2]])


def test_parquet_rows_read_like_json_rows_with_nulls_for_absent_columns(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(_table(), path, row_group_size=2)
    plain = {s[2:][0] if s[0] == "conv" else "tokens": s[2:] for s in _expected(tmp_path)}
    got = {s[2:][0] if s[0] == "conv" else "tokens": s[2:] for s in _summary(read_dataset(path))}
    assert got == plain
    assert count_rows(path) == 4


@pytest.mark.parametrize("writer", ["file", "stream"])
def test_arrow_ipc_files_and_streams_are_read(tmp_path, writer):
    path = tmp_path / "d.arrow"
    table = _table()
    with pa.OSFile(str(path), "wb") as sink:
        new = pa.ipc.new_file if writer == "file" else pa.ipc.new_stream
        with new(sink, table.schema) as w:
            for batch in table.to_batches(max_chunksize=3):
                w.write_batch(batch)
    assert [s[0] for s in _summary(read_dataset(path))] == ["conv", "conv", "conv", "tokens"]
    assert count_rows(path) == 4


def test_save_to_disk_directory_is_read_in_its_own_file_order(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"messages": r["messages"]} for r in ROWS if "messages" in r][:1] * 3).save_to_disk(
        str(tmp_path / "saved"), num_shards=2
    )
    items = list(read_dataset(tmp_path / "saved"))
    assert [i.file for i in items] == ["data-00000-of-00002.arrow"] * 2 + ["data-00001-of-00002.arrow"]
    assert [i.reason for i in items[1:]] == [ds.DUPLICATE, ds.DUPLICATE]
    assert "data-00000-of-00002.arrow:1" in items[1].detail


def test_directory_is_read_in_sorted_path_order_and_rejects_name_file_and_row(tmp_path):
    d = tmp_path / "mixed"
    (d / "b").mkdir(parents=True)
    (d / "a.jsonl").write_bytes(_jsonl(ROWS[:2]) + b"{oops\n")
    (d / "b" / "c.json").write_text(json.dumps(ROWS[2:]))
    pq.write_table(pa.Table.from_pylist([{"input_ids": [4, 4]}, {"input_ids": [-1]}]), d / "b" / "d.parquet")
    (d / "README.md").write_text("not data")
    (d / ".hidden.jsonl").write_text("{}")
    items = list(read_dataset(d))
    assert [(i.index, i.file, i.line) for i in items] == [
        (0, "a.jsonl", 1),
        (1, "a.jsonl", 2),
        (2, "a.jsonl", 3),
        (3, "b/c.json", 1),
        (4, "b/c.json", 2),
        (5, "b/d.parquet", 1),
        (6, "b/d.parquet", 2),
    ]
    rejects = [i.to_json() for i in items if isinstance(i, Reject)]
    assert rejects == [
        {"line": 3, "index": 2, "file": "a.jsonl", "reason": ds.MALFORMED_JSON, "detail": rejects[0]["detail"]},
        {"line": 2, "index": 6, "file": "b/d.parquet", "reason": ds.BAD_INPUT_IDS, "detail": rejects[1]["detail"]},
    ]
    assert count_rows(d) == 7


def test_appending_to_the_last_file_keeps_every_index(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "0.jsonl").write_bytes(_jsonl(ROWS[:2]))
    (d / "1.jsonl").write_bytes(_jsonl(ROWS[2:3]))
    before = [(i.index, i.file, i.line) for i in read_dataset(d)]
    with (d / "1.jsonl").open("ab") as f:
        f.write(_jsonl(ROWS[3:]))
    after = [(i.index, i.file, i.line) for i in read_dataset(d)]
    assert after[: len(before)] == before and len(after) == 4


def test_dataset_dict_directory_asks_for_one_split(tmp_path):
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"input_ids": [1]}])})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(HsextractError, match=r"pass one split's directory.*train"):
        read_dataset(tmp_path / "dd")


def test_directory_without_dataset_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(HsextractError, match="has no dataset files"):
        read_dataset(tmp_path)


def test_an_empty_dataset_file_is_refused_as_an_empty_directory_is(tmp_path):
    (tmp_path / "d.jsonl").write_bytes(b"")
    with pytest.raises(HsextractError, match=r"dataset file .*d\.jsonl is empty \(0 bytes\)"):
        read_dataset(tmp_path / "d.jsonl")
    with pytest.raises(HsextractError, match=r"its dataset files are all empty \(0 bytes: d\.jsonl\)"):
        read_dataset(tmp_path)
    (tmp_path / "e.jsonl").write_bytes(_jsonl(ROWS[:1]))
    assert len(list(read_dataset(tmp_path))) == 1  # an empty file beside data is a file of no rows


def test_a_row_over_the_size_bound_is_rejected_unparsed_and_the_next_row_is_read(tmp_path):
    big = {"messages": [{"role": "user", "content": "x" * 5000}, {"role": "assistant", "content": "ok"}]}
    path = tmp_path / "d.jsonl"
    path.write_bytes(_jsonl([ROWS[0], big, ROWS[1]]))
    items = list(read_dataset(path, ds.DatasetReader(max_row_bytes=4096)))
    assert [type(i).__name__ for i in items] == ["Sample", "Reject", "Sample"]
    rej = items[1].to_json()
    assert (rej["reason"], rej["file"], rej["line"], rej["max_row_bytes"]) == (ds.ROW_TOO_LARGE, "d.jsonl", 2, 4096)
    assert rej["size"] == len(json.dumps(big)) and "--max-row-bytes" in rej["detail"]
    assert all(isinstance(i, Sample) for i in read_dataset(path, ds.DatasetReader(max_row_bytes=8192)))


def test_a_table_row_over_the_size_bound_is_rejected_by_its_characters(tmp_path):
    pq.write_table(
        pa.Table.from_pylist(
            [ROWS[1], {"messages": [{"role": "user", "content": "y" * 5000}, {"role": "assistant", "content": "ok"}]}]
        ),
        tmp_path / "d.parquet",
    )
    items = list(read_dataset(tmp_path / "d.parquet", ds.DatasetReader(max_row_bytes=4096)))
    assert isinstance(items[0], Sample) and (items[1].reason, items[1].line) == (ds.ROW_TOO_LARGE, 2)
    assert "characters" in items[1].detail


def test_hidden_files_of_a_directory_are_skipped_and_logged(tmp_path, caplog):
    (tmp_path / "a.jsonl").write_bytes(_jsonl(ROWS[:1]))
    (tmp_path / ".hidden.jsonl").write_bytes(_jsonl(ROWS[1:2]))
    (tmp_path / "_cache").mkdir()
    (tmp_path / "_cache" / "b.jsonl").write_bytes(_jsonl(ROWS[2:3]))
    with caplog.at_level(logging.INFO, logger="hsextract.dataset"):
        items = list(read_dataset(tmp_path))
    assert [i.file for i in items] == ["a.jsonl"]
    assert any(
        "skipping 2 hidden files and directories" in m and ".hidden.jsonl" in m and "_cache" in m
        for m in caplog.messages
    ), caplog.messages


# -- properties: arbitrary input of every shape never crashes, every row is accounted for ------------


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


SHAPES = {
    "d.jsonl": lambda b: b,
    "d.json": lambda b: b,
    "a.json": lambda b: b"[" + b,  # looks like an array, then anything
    "d.jsonl.gz": gzip.compress,
    "raw.jsonl.gz": lambda b: b,  # not gzip at all
    "cut.jsonl.gz": lambda b: gzip.compress(b)[: max(1, len(b) // 2)],
    "d.jsonl.zst": _zst,
    "raw.jsonl.zst": lambda b: b,
    "d.parquet": lambda b: b,
    "d.arrow": lambda b: b,
}


def _check_accounted(path):
    items = list(read_dataset(path))
    assert len(items) == count_rows(path)
    for index, item in enumerate(items):
        assert item.index == index and isinstance(item, (Sample, Reject))
        if isinstance(item, Reject):
            assert item.reason and json.dumps(item.to_json())
        else:
            assert item.is_tokenized or any(m.role == "assistant" for m in item.messages)
    return items


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(SHAPES)), st.binary(max_size=300))
def test_arbitrary_bytes_in_any_dataset_file_never_crash_and_every_row_is_accounted_for(tmp_path, name, data):
    path = _write(tmp_path / name, SHAPES[name](data))
    if path.stat().st_size == 0:  # refused as a whole (see test_an_empty_dataset_file_is_refused)
        with pytest.raises(HsextractError, match="is empty"):
            read_dataset(path)
        return
    _check_accounted(path)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
_turn = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "assistant", "system", "tool", "narrator"]),
        "content": st.one_of(st.text(max_size=8), st.none()),
        "reasoning_content": st.one_of(st.text(max_size=8), st.none()),
        "tool_call_id": st.one_of(st.text(max_size=3), st.none()),
        "tool_calls": st.one_of(
            st.none(),
            st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "id": st.text(max_size=3),
                        "function": st.fixed_dictionaries(
                            {},
                            optional={
                                "name": st.text(max_size=6),
                                "arguments": st.one_of(st.text(max_size=10), _json_values),
                            },
                        ),
                    },
                ),
                max_size=2,
            ),
            _json_values,
        ),
    },
)
_row = st.fixed_dictionaries(
    {},
    optional={
        "messages": st.lists(_turn, max_size=4),
        "tools": st.one_of(_json_values, st.text(max_size=20)),
        "id": st.one_of(st.text(max_size=4), st.integers(), st.none()),
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_row, max_size=5))
def test_arbitrary_tool_conversations_as_a_json_array_are_accepted_only_when_usable(tmp_path, rows):
    items = _check_accounted(_write(tmp_path / "d.json", json.dumps(rows).encode()))
    assert len(items) == len(rows)
    for item in items:
        if isinstance(item, Sample):
            for prev, m in zip((None, *item.messages), item.messages, strict=False):
                if m.role == "tool":
                    assert prev is not None and prev.role in ("assistant", "tool")
                if m.role == "assistant":
                    assert m.content.strip() or m.tool_calls or (m.reasoning_content or "").strip()
                    assert all(c.name.strip() for c in m.tool_calls)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_json_values, max_size=6), st.integers(1, 9), st.booleans())
def test_any_json_array_splits_into_exactly_its_elements_at_any_block_size(tmp_path, values, block, indent):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(values, indent=2 if indent else None, ensure_ascii=False))
    saved, sources.BLOCK = sources.BLOCK, block
    try:
        elements = list(sources._array_elements(sources.DataFile(path, "d.json", "text")))
    finally:
        sources.BLOCK = saved
    assert [json.loads(e) for e in elements] == values


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.fixed_dictionaries({"messages": st.lists(_turn, min_size=1, max_size=3).map(json.dumps)}),
        min_size=1,
        max_size=6,
    )
)
def test_arbitrary_rows_in_parquet_are_all_accounted_for(tmp_path, rows):
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf, row_group_size=2)
    items = _check_accounted(_write(tmp_path / "d.parquet", buf.getvalue()))
    assert len(items) == len(rows)
