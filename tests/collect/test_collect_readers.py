"""The collected set of three hosts loads in each trainer's own reader with every dataset sample
exactly once, its tokens and hidden states those the hosts' drains wrote."""

from __future__ import annotations

import json

import pytest
from hsextract.output.manifest import iter_entries
from support.reader_check import assert_reader_sees_captured, load_with_reader

pytestmark = [pytest.mark.slow, pytest.mark.readers, pytest.mark.timeout(600)]


@pytest.mark.parametrize("fmt", ["specforge", "speculators", "speculators-v1", "modelopt"])
def test_the_collected_set_loads_in_the_trainers_reader_with_every_sample_once(fmt, readers, fleets, collect, tmp_path):
    fleet, into = fleets(fmt), tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args())
    assert code == 0, err
    loaded = load_with_reader(readers, fmt, into, num_aux=3, hidden=64)
    assert len(loaded["samples"]) == len(fleet.samples) == 27
    assert_reader_sees_captured(fmt, into, loaded, fleet.samples)
    assert {e.host for e in iter_entries(into)} == {"a", "b", "c"}
    if fmt == "specforge":  # the reader's own positions are the ones reader_order.json lists
        order = json.loads((into / "reader_order.json").read_text())["order"]
        assert loaded["order"] == [row[0] for row in order]
