"""The capture's decisions: which rows, where they go, when a dump is complete."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hsextract import fingerprint
from hsextract.capture.core import (
    BatchRequest,
    CapturePlanner,
    CaptureSettings,
    LandedMeta,
    add_range,
    select_requests,
)
from hsextract.layers import resolve


def settings(**kw) -> CaptureSettings:
    base = dict(rid_prefix="hsx", layers=resolve(None, 8), hidden_size=4, architecture="LlamaForCausalLM")
    base.update(kw)
    return CaptureSettings(**base)


def req(rid: str, prefix: int, extend: int, row: int = 0, index: int = 0) -> BatchRequest:
    return BatchRequest(rid, row, prefix, extend, index)


def test_only_rids_with_the_run_prefix_are_selected_with_their_row_offsets():
    rids = ["HEALTH_CHECK_1", "hsx-ab12cd34-0", "other-ab12cd34-1", "hsxx-1", "hsx-ab12cd34-2", None]
    picked = select_requests(rids, [0] * 6, [3, 5, 2, 4, 6, 1], settings())
    assert [(r.rid, r.batch_row, r.extend_len, r.index) for r in picked] == [
        ("hsx-ab12cd34-0", 3, 5, 1),
        ("hsx-ab12cd34-2", 14, 6, 4),
    ]


@pytest.mark.parametrize(
    "rid",
    [
        "hsx-x/../../../../tmp/pwn",  # climbs out of the staging directory
        "hsx-ab12cd34-0/../../pwn",
        "hsx-../../pwn-ab12cd34-0",
        "hsx-/etc-ab12cd34-0",
        "hsx-ab12cd34-0/",
        "hsx-ab12cd34-",  # no index
        "hsx-AB12CD34-0",  # the run id is lower-case hex
        "hsx-ab12-0",  # a run id too short
        "hsx-ab12cd34-0x",
        "hsx-ab12cd34-pzz",  # a probe's tag is hex
        "hsx.y-ab12cd34-0",  # another prefix that starts like ours
    ],
)
def test_rids_that_are_not_the_clients_ids_of_this_prefix_are_never_selected(rid):
    assert select_requests([rid, "hsx-ab12cd34-1"], [0, 0], [3, 4], settings()) == [
        req("hsx-ab12cd34-1", 0, 4, row=3, index=1)
    ]


def test_the_clients_sample_and_probe_ids_are_selected():
    rids = ["hsx-ab12cd34-0", "hsx-0123456789abcdef0123456789abcdef-17", "hsx-ab12cd34-p0a1b2c3d4e5f"]
    assert [r.rid for r in select_requests(rids, [0] * 3, [1] * 3, settings())] == rids


def test_a_refused_rid_of_the_run_prefix_is_logged_once_with_the_reason(caplog):
    rid = "hsx-x/../../../../tmp/pwn2"
    with caplog.at_level(logging.WARNING, logger="hsextract.capture"):
        for _ in range(3):
            assert select_requests([rid], [0], [5], settings()) == []
    logged = [r.getMessage() for r in caplog.records if rid in r.getMessage()]
    assert len(logged) == 1, logged
    assert "not captured" in logged[0] and "<prefix>-<run id>-<index>" in logged[0]


def test_batch_without_rids_selects_nothing():
    assert select_requests(None, [], [], settings()) == []


def test_chunks_are_placed_by_offset_and_complete_only_when_all_rows_are_covered():
    p = CapturePlanner(settings())
    rid = "hsx-ab12cd34-0"
    s1 = p.plan([req(rid, 0, 16)], [40])
    assert [(s.dst_row, s.rows, s.create) for s in s1] == [(0, 16, True)]
    assert not p.get(rid).complete
    s2 = p.plan([req(rid, 16, 16)], [40])
    assert [(s.dst_row, s.rows, s.create) for s in s2] == [(16, 16, False)]
    assert not p.get(rid).complete
    p.plan([req(rid, 32, 8)], [40])
    state = p.get(rid)
    assert state.complete and state.marker is not None
    assert state.marker.chunks == [[0, 16], [16, 16], [32, 8]]
    assert state.marker.prompt_len == 40


def test_a_request_missing_its_cached_prefix_is_never_written_and_is_reported_failed():
    p = CapturePlanner(settings())
    rid = "hsx-ab12cd34-0"
    assert p.plan([req(rid, 8, 32)], [40]) == []  # first 8 rows came from a prefix cache
    assert p.skipped_partial == 1
    assert [(f.rid, f.reason) for f in p.take_failures()] == [(rid, "missing_rows")]
    assert p.plan([req(rid, 40, 1)], [40]) == [] and p.take_failures() == [], "its later rows are ignored quietly"


def test_a_failed_request_sent_again_from_row_0_starts_a_new_dump():
    p = CapturePlanner(settings())
    rid = "hsx-ab12cd34-0"
    p.plan([req(rid, 0, 16)], [40])
    p.get(rid).pending = 0  # the writer finished (and failed) the first chunk's write
    p.fail(rid, "write_error")
    assert p.plan([req(rid, 16, 16)], [40]) == [], "a later chunk of the failed send writes nothing"
    again = p.plan([req(rid, 0, 16)], [40])
    assert [(s.dst_row, s.rows, s.create) for s in again] == [(0, 16, True)]
    assert not p.get(rid).failed


def _rows(values, start: int, n: int, prompt_len: int) -> LandedMeta:
    return LandedMeta(prompt_lens=[prompt_len], row_values=values[start : start + n])


def test_a_request_sent_again_from_row_0_before_it_was_complete_is_captured_as_one_pass():
    """The client died mid-prefill (SGLang aborted the request, and the capture is not told); the
    restarted client sends the same rid from row 0. The dump is that second send's alone."""
    p = CapturePlanner(settings())
    rid = "hsx-ab12cd34-0"
    values = np.arange(1, 41, dtype=np.int64) * 7919
    p.plan([req(rid, 0, 16)], _rows(values, 0, 16, 40))
    p.plan([req(rid, 16, 16)], _rows(values, 16, 16, 40))
    p.get(rid).pending = 0  # the writer wrote the aborted send's two chunks
    again = p.plan([req(rid, 0, 16)], _rows(values, 0, 16, 40))
    assert [(s.dst_row, s.rows, s.create) for s in again] == [(0, 16, True)], "the file is created anew"
    p.plan([req(rid, 16, 16)], _rows(values, 16, 16, 40))
    p.plan([req(rid, 32, 8)], _rows(values, 32, 8, 40))
    state = p.get(rid)
    assert state.complete and not state.failed
    assert state.marker.chunks == [[0, 16], [16, 16], [32, 8]]
    assert state.marker.fingerprint == fingerprint.to_text(fingerprint.combine(values, 0))
    assert p.take_failures() == []


def test_a_send_from_row_0_while_the_earlier_sends_writes_are_in_flight_writes_nothing_over_them():
    p = CapturePlanner(settings())
    rid = "hsx-ab12cd34-0"
    first = p.plan([req(rid, 0, 16)], [40])
    assert p.plan([req(rid, 0, 16)], [40]) == [], "its rows would race the first send's writes into one file"
    assert first[0].state.failed, "the first send can never complete: its later writes are dropped"
    assert [f.reason for f in p.take_failures()] == ["missing_rows"], "the client learns the sample must come again"


def test_decode_rows_of_a_mixed_batch_are_not_written():
    p = CapturePlanner(settings())
    p.plan([req("hsx-ab12cd34-0", 0, 20)], [20])
    # MIXED batch: a new request's prefill, a decode row of the tracked request (row 21 of a
    # sequence whose prompt was 20), and one of a request no longer tracked.
    segs = p.plan(
        [
            req("hsx-ab12cd34-1", 0, 5, row=0, index=0),
            req("hsx-ab12cd34-0", 21, 1, row=5, index=1),
            req("hsx-ab12cd34-9", 30, 1, row=6, index=2),
        ],
        [5, 22, 31],
    )
    assert [(s.state.rid, s.rows) for s in segs] == [("hsx-ab12cd34-1", 5)]
    # the untracked request never had its first 30 rows seen: it can never complete, so it is failed
    assert [f.rid for f in p.take_failures()] == ["hsx-ab12cd34-9"]


def test_rows_past_the_prompt_in_the_last_chunk_are_clipped():
    p = CapturePlanner(settings())
    p.plan([req("hsx-ab12cd34-0", 0, 16)], [20])
    segs = p.plan([req("hsx-ab12cd34-0", 16, 10)], [20])
    assert [(s.dst_row, s.rows) for s in segs] == [(16, 4)]
    assert p.get("hsx-ab12cd34-0").complete


def test_a_complete_request_ignores_a_later_re_prefill():
    p = CapturePlanner(settings())
    rid = "hsx-ab12cd34-0"
    p.plan([req(rid, 0, 12)], [12])
    assert p.get(rid).complete
    # Retraction: the request is prefilled again with its output token appended.
    assert p.plan([req(rid, 0, 13)], [13]) == []
    assert p.get(rid).marker.chunks == [[0, 12]]


def test_a_resent_sample_is_captured_again_once_its_dump_was_drained():
    staged = {"hsx-ab12cd34-0"}
    p = CapturePlanner(settings(), is_staged=lambda rid: rid in staged)
    rid = "hsx-ab12cd34-0"
    p.plan([req(rid, 0, 12)], [12])
    staged.clear()
    assert p.plan([req(rid, 0, 12)], [12]) == []  # the first dump's writes are still in flight
    p.get(rid).done_written = True  # the writer finished it
    staged.add(rid)
    assert p.plan([req(rid, 0, 12)], [12]) == []  # its dump is still staged: nothing to redo
    staged.clear()  # the drain took it
    assert p.plan([req(rid, 0, 13)], [13]) == []  # retraction re-prefill (longer): still ignored
    segs = p.plan([req(rid, 0, 12)], [12])  # the client sends the sample again
    assert [(s.dst_row, s.rows, s.create) for s in segs] == [(0, 12, True)]
    assert p.get(rid).complete


def test_tracking_is_bounded_and_evicts_the_least_recent():
    p = CapturePlanner(settings(max_tracked=3))
    for i in range(5):
        p.plan([req(f"hsx-ab12cd34-{i}", 0, 4)], [8])  # half done: incomplete
    assert len(p) == 3
    assert p.get("hsx-ab12cd34-0") is None and p.get("hsx-ab12cd34-4") is not None
    assert p.evicted_incomplete == 2


def test_ranges_merge_when_they_touch_or_overlap():
    r: list[list[int]] = []
    for a, b in [(16, 32), (0, 8), (8, 16), (40, 48), (30, 41)]:
        r = add_range(r, a, b)
    assert r == [[0, 48]]
    assert add_range([[0, 4]], 6, 8) == [[0, 4], [6, 8]]


def test_done_marker_records_layers_in_both_conventions_and_placement():
    s = settings(final_hidden="pre_norm", sglang_version="0.5.23", model_path="/models/x")
    p = CapturePlanner(s)
    p.plan([req("hsx-ab12cd34-0", 0, 3)], [3])
    m = p.get("hsx-ab12cd34-0").marker
    assert m.eagle_aux_hidden_state_layer_ids == [1, 3, 4]
    assert m.sglang_layers_to_capture == [2, 4, 5]
    assert (m.final_hidden, m.num_aux, m.hidden_size, m.dtype) == ("pre_norm", 3, 4, "bfloat16")
    assert (m.architecture, m.sglang_version, m.model_path) == ("LlamaForCausalLM", "0.5.23", "/models/x")
