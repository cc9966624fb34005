"""Layer ids: the project translates between the draft config's and SGLang's conventions itself."""

from __future__ import annotations

import pytest
from hsextract.errors import LayerConfigError
from hsextract.layers import default_eagle_ids, parse_ids, resolve


def test_default_for_61_layers_is_eagle_1_29_57_and_sglang_2_30_58():
    layers = resolve(None, 61)
    assert layers.eagle_aux_hidden_state_layer_ids == (1, 29, 57)
    assert layers.sglang_layers_to_capture == (2, 30, 58)


def test_eagle_ids_always_map_to_sglang_plus_one_even_when_the_first_id_is_not_1():
    # SGLang's DeepSeek setter adds +1 only when ids[0] == 1; the project never inherits that quirk.
    assert resolve([2, 29, 57], 61).sglang_layers_to_capture == (3, 30, 58)


def test_sglang_convention_input_is_translated_back_to_eagle_ids():
    layers = resolve([2, 30, 58], 61, convention="sglang")
    assert layers.eagle_aux_hidden_state_layer_ids == (1, 29, 57)


def test_out_of_range_ids_fail_with_the_valid_range_in_the_message():
    with pytest.raises(LayerConfigError, match=r"\[0, 59\]"):
        resolve([1, 29, 60], 61)
    with pytest.raises(LayerConfigError, match=r"\[1, 7\]"):
        resolve([1, 8], 8, convention="sglang")


def test_repeated_or_unsorted_ids_are_refused():
    with pytest.raises(LayerConfigError, match="strictly increasing"):
        resolve([3, 1], 8)


def test_unknown_convention_is_refused_by_name():
    with pytest.raises(LayerConfigError, match="convention 'hf'"):
        resolve([1], 8, convention="hf")  # type: ignore[arg-type]


def test_ids_parse_from_text_and_garbage_is_explained():
    assert parse_ids("1, 29,57") == [1, 29, 57]
    assert parse_ids("[1,2]") == [1, 2]
    assert parse_ids("") is None
    with pytest.raises(LayerConfigError, match="comma-separated integers"):
        parse_ids("one,two")


def test_tiny_model_default_layers_are_distinct():
    assert default_eagle_ids(8) == [1, 3, 4]
