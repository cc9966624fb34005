"""A sample's fingerprint: the same from the device's rows, the host's bytes and the staged file,
however the request was chunked, and changed by any row that is wrong or out of place, and by
words of a row swapped or changed by +x and -x."""

from __future__ import annotations

import numpy as np
import torch
from hsextract import fingerprint


def rows(n: int, seed: int = 0, width: int = 4 * 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, width, generator=g).to(torch.bfloat16), torch.randint(0, 300, (n,), generator=g)


def test_row_values_from_tensors_and_from_host_bytes_agree():
    block, ids = rows(40)
    from_tensor = fingerprint.row_values(block, ids)
    from_bytes = fingerprint.row_values_np(block.view(torch.uint8).numpy(), ids.numpy(), block.shape[1] * 2)
    assert from_tensor.tolist() == from_bytes.tolist()


def test_rows_of_any_byte_width_are_summed_in_words_that_divide_them():
    for width in (3, 5, 6, 64):  # bf16 rows of 6, 10, 12 and 128 bytes: words of 2, 2, 4 and 8 bytes
        block, ids = rows(7, width=width)
        got = fingerprint.row_values(block, ids).tolist()
        assert got == fingerprint.row_values_np(block.view(torch.uint8).numpy(), ids.numpy(), width * 2).tolist()


def test_a_request_fingerprinted_in_chunks_equals_the_whole():
    block, ids = rows(40)
    values = fingerprint.row_values(block, ids).numpy()
    whole = fingerprint.combine(values, 0)
    parts = 0
    for start, end in [(0, 16), (16, 32), (32, 40)]:
        parts = fingerprint.add(parts, fingerprint.combine(values[start:end], start))
    assert parts == whole
    assert fingerprint.to_text(whole) == fingerprint.of_states(block.view(40, 4, 16), ids)


def test_a_changed_value_a_swapped_row_or_another_id_changes_the_fingerprint():
    block, ids = rows(40)
    base = fingerprint.of_states(block, ids)
    changed = block.clone()
    changed[17, 3] = changed[17, 3] + 1
    swapped = block.clone()
    swapped[[3, 9]] = block[[9, 3]]
    other_ids = ids.clone()
    other_ids[0] += 1
    assert (
        len(
            {
                base,
                fingerprint.of_states(changed, ids),
                fingerprint.of_states(swapped, ids),
                fingerprint.of_states(block, other_ids),
            }
        )
        == 4
    )


def test_wrapping_sums_do_not_depend_on_the_order_of_the_reduction():
    values = np.array([2**62, 2**62, 2**62, -5], dtype=np.int64)
    assert fingerprint.add(
        fingerprint.combine(values[:2], 0), fingerprint.combine(values[2:], 2)
    ) == fingerprint.combine(values, 0)


def test_the_device_path_sums_the_same_weighted_words_as_the_host_path():
    """`weighted_word_sums` is what a GPU runs (a multiply and a sum per piece of rows); on the CPU
    it must give the host path's numbers, for every word width."""
    for width in (3, 5, 6, 64, 4 * 4096):
        block, ids = rows(37, width=width)
        row_bytes = width * 2
        words = block.view(torch.uint8).view(fingerprint._TORCH_WORDS[fingerprint.word_bytes(row_bytes)])
        on_device = fingerprint.weighted_word_sums(words.reshape(37, -1)) + ids * fingerprint._ID_MULT
        assert on_device.tolist() == fingerprint.row_values(block, ids).tolist()


def _words(block: torch.Tensor) -> torch.Tensor:
    return block.view(torch.int64)  # a row of 64 bf16 values is 16 words of 8 bytes


def test_two_words_of_a_row_swapped_change_the_fingerprint():
    block, ids = rows(40)
    swapped = block.clone()
    w = _words(swapped)
    w[5, [0, 15]] = _words(block)[5, [15, 0]]
    assert fingerprint.of_states(swapped, ids) != fingerprint.of_states(block, ids)


def test_plus_x_in_one_word_and_minus_x_in_another_change_the_fingerprint():
    block, ids = rows(40)
    moved = block.clone()
    w = _words(moved)
    w[7, 1] += 2**40
    w[7, 2] -= 2**40
    assert fingerprint.of_states(moved, ids) != fingerprint.of_states(block, ids)


def test_a_fingerprint_names_its_version_and_the_bare_digits_of_version_1_are_read_as_such():
    text = fingerprint.to_text(0xABC)
    assert text == "fp2:0000000000000abc" and fingerprint.version_of(text) == fingerprint.VERSION == 2
    assert fingerprint.version_of("00000000deadbeef") == 1
    assert fingerprint.version_of("") is None and fingerprint.version_of("fp2:xyz") is None
