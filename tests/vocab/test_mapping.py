"""Which tokens make the draft vocabulary, and how each trainer's mapping encodes them (pure functions)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hsextract.vocab.counts import TokenCounts, masked_counts
from hsextract.vocab.mapping import (
    VocabError,
    check_ids,
    frequency_d2t,
    resolve_sizes,
    select_tokens,
    sorted_mapping,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from vocab.vocab_data import expected_selection


def test_only_loss_masked_tokens_are_counted():
    ids, n = masked_counts([5, 9, 5, 7, 5], [1, 0, 1, 1, 0])
    assert dict(zip(ids.tolist(), n.tolist(), strict=True)) == {5: 2, 7: 1}


def test_ties_go_to_the_lower_id_and_padding_to_the_lowest_uncounted_ids():
    counts = TokenCounts.from_dict({9: 3, 4: 3, 2: 5, 1: 1})
    assert select_tokens(counts, 3).tolist() == [2, 4, 9]
    assert select_tokens(counts, 6).tolist() == [2, 4, 9, 1, 0, 3]


def test_sorted_mapping_and_modelopt_d2t_address_the_same_ids():
    selected = np.array([42, 3, 17])
    d2t, t2d = sorted_mapping(selected, 50)
    assert (d2t + np.arange(3)).tolist() == [3, 17, 42]
    assert np.flatnonzero(t2d).tolist() == [3, 17, 42] and t2d.dtype == bool and t2d.shape == (50,)
    assert (frequency_d2t(selected) + np.arange(3)).tolist() == [42, 3, 17]


def test_a_size_of_the_whole_vocabulary_or_more_is_clamped_and_below_one_refused():
    sizes = resolve_sizes([16, 500, 900, 16], 500)
    assert [(d.requested, d.size, d.clamped) for d in sizes] == [(16, 16, False), (500, 500, False)]
    assert [(d.requested, d.size) for d in resolve_sizes([900], 500)] == [(900, 500)]
    with pytest.raises(VocabError, match="draft vocabulary size 0: must be at least 1"):
        resolve_sizes([0], 500)
    with pytest.raises(VocabError, match="vocabulary size is unknown"):
        resolve_sizes([16], 0)


def test_a_trained_token_outside_the_vocabulary_is_an_error_naming_it():
    with pytest.raises(VocabError, match="token id 600 is trained on"):
        check_ids(TokenCounts.from_dict({3: 1, 600: 2}), 500)


@settings(max_examples=100, deadline=None)
@given(freq=st.dictionaries(st.integers(0, 300), st.integers(1, 6), max_size=80), n=st.integers(1, 120))
def test_the_selection_is_the_trainers_rule(freq, n):
    assert select_tokens(TokenCounts.from_dict(freq), n).tolist() == expected_selection(Counter(freq), n)


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(st.dictionaries(st.integers(0, 2000), st.integers(1, 9), max_size=30), max_size=8))
def test_counts_add_up_like_a_counter(parts):
    total, want = TokenCounts(), Counter()
    for p in parts:
        ids = np.array(sorted(p), dtype=np.int64)
        total.add(ids, np.array([p[i] for i in sorted(p)], dtype=np.int64))
        want.update(p)
    assert total.to_dict() == dict(want) and total.total == sum(want.values())
    assert TokenCounts.from_dict(total.to_dict()) == total
