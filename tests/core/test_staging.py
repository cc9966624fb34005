"""The staging file is a valid safetensors file that the writer fills row range by row range."""

from __future__ import annotations

import os

import pytest
import torch
from hsextract.errors import StagingError
from hsextract.staging import (
    DoneMarker,
    StateFileLayout,
    iter_complete,
    read_done_marker,
    read_states,
    write_done_marker,
)
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
        rid="hsx-aaaaaaaa-1", prompt_len=3, num_aux=3, hidden_size=8, dtype="bfloat16",
        eagle_aux_hidden_state_layer_ids=[1, 3, 4], sglang_layers_to_capture=[2, 4, 5],
        num_hidden_layers=8, final_hidden="post_norm", architecture="LlamaForCausalLM",
    )
    write_done_marker(tmp_path, marker)
    assert [p.name for p in iter_complete(tmp_path)] == ["hsx-aaaaaaaa-1"]
    assert read_done_marker(tmp_path / "hsx-aaaaaaaa-1") == marker
    assert not list((tmp_path / "hsx-aaaaaaaa-1").glob(".*tmp"))
