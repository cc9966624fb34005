"""The staging file is a valid safetensors file that the writer fills row range by row range."""

from __future__ import annotations

import json
import os

import pytest
import torch
from hsextract.errors import StagingError
from hsextract.staging.dumps import (
    DoneMarker,
    StateFileLayout,
    iter_complete,
    read_done_marker,
    read_states,
    write_done_marker,
)
from hypothesis import given
from hypothesis import strategies as st
from safetensors import safe_open


def _write_in_chunks(path, hidden: torch.Tensor, ids: torch.Tensor, chunks: list[tuple[int, int]]) -> None:
    layout = StateFileLayout(prompt_len=hidden.shape[0], num_slots=hidden.shape[1], hidden_size=hidden.shape[2])
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, layout.file_size)
        os.pwrite(fd, layout.header, 0)
        for start, n in chunks:
            rows = hidden[start : start + n].contiguous().view(torch.uint8).numpy().tobytes()
            os.pwrite(fd, rows, layout.hidden_offset(start))
            os.pwrite(fd, ids[start : start + n].numpy().tobytes(), layout.ids_offset(start))
    finally:
        os.close(fd)


def test_chunks_written_at_offsets_read_back_as_one_request(tmp_path):
    hidden = torch.randn(40, 4, 16).bfloat16()
    ids = torch.arange(100, 140)
    path = tmp_path / "states.safetensors"
    _write_in_chunks(path, hidden, ids, [(32, 8), (0, 16), (16, 16)])
    staged = read_states(path)
    assert torch.equal(staged.hidden, hidden)
    assert torch.equal(staged.input_ids, ids)


def test_staging_file_loads_with_the_safetensors_library(tmp_path):
    hidden = torch.randn(5, 2, 8).bfloat16()
    ids = torch.arange(5)
    path = tmp_path / "states.safetensors"
    _write_in_chunks(path, hidden, ids, [(0, 5)])
    with safe_open(str(path), framework="pt") as f:
        assert torch.equal(f.get_tensor("hidden"), hidden)
        assert torch.equal(f.get_tensor("input_ids"), ids)


def test_truncated_staging_file_is_reported_with_its_path(tmp_path):
    path = tmp_path / "states.safetensors"
    _write_in_chunks(path, torch.randn(10, 2, 8).bfloat16(), torch.arange(10), [(0, 10)])
    data = path.read_bytes()
    path.write_bytes(data[:-20])
    with pytest.raises(StagingError, match=f"{path}: truncated"):
        read_states(path)


def test_only_directories_with_a_done_marker_count_as_complete(tmp_path):
    for rid in ("hsx-aaaaaaaa-0", "hsx-aaaaaaaa-1"):
        (tmp_path / rid).mkdir()
    (tmp_path / "_records").mkdir()
    marker = DoneMarker(
        rid="hsx-aaaaaaaa-1",
        prompt_len=3,
        num_aux=3,
        hidden_size=8,
        dtype="bfloat16",
        eagle_aux_hidden_state_layer_ids=[1, 3, 4],
        sglang_layers_to_capture=[2, 4, 5],
        num_hidden_layers=8,
        final_hidden="post_norm",
        architecture="LlamaForCausalLM",
    )
    write_done_marker(tmp_path, marker)
    assert [p.name for p in iter_complete(tmp_path)] == ["hsx-aaaaaaaa-1"]
    assert read_done_marker(tmp_path / "hsx-aaaaaaaa-1") == marker
    assert not list((tmp_path / "hsx-aaaaaaaa-1").glob(".*tmp"))


_markers = st.builds(
    DoneMarker,
    rid=st.text(min_size=1, max_size=40),
    prompt_len=st.integers(1, 1 << 20),
    num_aux=st.integers(1, 8),
    hidden_size=st.integers(1, 1 << 16),
    dtype=st.sampled_from(["bfloat16", "float16", "float32"]),
    eagle_aux_hidden_state_layer_ids=st.lists(st.integers(0, 200), max_size=8),
    sglang_layers_to_capture=st.lists(st.integers(0, 200), max_size=8),
    num_hidden_layers=st.integers(1, 200),
    final_hidden=st.sampled_from(["post_norm", "pre_norm"]),
    architecture=st.text(max_size=40),
    chunks=st.lists(st.lists(st.integers(0, 1 << 20), min_size=2, max_size=2), min_size=1, max_size=5),
    model_path=st.text(max_size=60),
    completed_at=st.floats(0, 4e9, allow_nan=False),
)


@given(_markers, st.text(min_size=1, max_size=40), st.floats(0, 4e9, allow_nan=False))
def test_a_done_marker_reads_back_as_written_with_its_shared_fields_encoded_once(marker, other_rid, other_time):
    """The capture encodes the fields every marker shares once and passes them to each marker:
    every marker still reads back exactly, whatever its rid (quotes, unicode) and numbers."""
    assert DoneMarker.from_dict(json.loads(marker.to_json())) == marker
    sibling = DoneMarker(**{**vars(marker), "rid": other_rid, "completed_at": other_time, "chunks": [[0, 7]]})
    assert DoneMarker.from_dict(json.loads(sibling.to_json(marker.shared_json()))) == sibling


def test_a_done_marker_is_written_whole_under_its_final_name(tmp_path):
    marker = DoneMarker(
        rid="hsx-ab12cd34-3",
        prompt_len=5,
        num_aux=3,
        hidden_size=16,
        dtype="bfloat16",
        eagle_aux_hidden_state_layer_ids=[1, 3, 4],
        sglang_layers_to_capture=[2, 4, 5],
        num_hidden_layers=8,
        final_hidden="post_norm",
        architecture="LlamaForCausalLM",
        chunks=[[0, 5]],
        completed_at=1.5,
    )
    (tmp_path / marker.rid).mkdir()
    write_done_marker(tmp_path, marker, marker.shared_json())
    assert read_done_marker(tmp_path / marker.rid) == marker
    assert sorted(os.listdir(tmp_path / marker.rid)) == ["done.json"]  # no temporary left behind
