"""When staging is short of space or the drain lags, the client must wait, and say why."""

from __future__ import annotations

import os

import pytest
from hsextract.client.backpressure import (
    PAUSE_POLL_FAST_FOR_S,
    RECOUNT_S,
    Backpressure,
    Watermark,
    parse_watermark,
    pause_poll_s,
)
from hsextract.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("10%", Watermark(fraction=0.10)),
        ("0%", Watermark(fraction=0.0)),
        ("2G", Watermark(bytes=2 << 30)),
        ("512MiB", Watermark(bytes=512 << 20)),
        ("1.5k", Watermark(bytes=1536)),
        ("1048576", Watermark(bytes=1 << 20)),
        (4096, Watermark(bytes=4096)),
    ],
)
def test_watermark_accepts_bytes_and_percentages(text, want):
    assert parse_watermark(text) == want


@pytest.mark.parametrize("text", ["", "ten", "100%", "-1%", "5 parsecs"])
def test_watermark_rejects_nonsense_with_an_example(text):
    with pytest.raises(ConfigError, match=r"e\.g\."):
        parse_watermark(text)


def _free(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_sending_is_allowed_above_the_watermark(tmp_path):
    bp = Backpressure(tmp_path, Watermark(bytes=0), max_staged=None, bytes_per_token=512)
    assert bp.reason(inflight_requests=3, inflight_tokens=100, next_tokens=10) is None


def test_free_space_below_the_watermark_pauses_with_the_numbers(tmp_path):
    bp = Backpressure(tmp_path, Watermark(bytes=_free(tmp_path) + (1 << 30)), max_staged=None, bytes_per_token=512)
    reason = bp.reason()
    assert reason and str(tmp_path) in reason and "watermark" in reason


def test_requests_in_flight_count_against_the_free_space(tmp_path):
    free = _free(tmp_path)
    bp = Backpressure(tmp_path, Watermark(bytes=max(0, free - (64 << 20))), max_staged=None, bytes_per_token=1 << 20)
    assert bp.reason(inflight_tokens=0) is None
    assert "in flight" in bp.reason(inflight_tokens=128)


def test_staged_dumps_at_the_limit_pause_until_the_drain_catches_up(tmp_path):
    for i in range(3):
        (tmp_path / f"hsx-0123abcd-{i}").mkdir()
    (tmp_path / "_records").mkdir()  # not a dump
    bp = Backpressure(tmp_path, Watermark(bytes=0), max_staged=4, bytes_per_token=1)
    assert bp.reason(inflight_requests=0) is None
    assert "drain is behind" in bp.reason(inflight_requests=1)
    (tmp_path / "hsx-0123abcd-0").rmdir()
    assert bp.reason(inflight_requests=1) is None


def test_the_status_counts_a_pause_under_way_and_the_summary_every_pause(monkeypatch):
    from hsextract.client import progress

    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    stats = progress.RunStats()
    stats.pause_begins("staging below the watermark")
    now[0] += 4.0
    stats.pause_begins("staging below the watermark")  # the loop looks again: the same pause goes on
    assert stats.snapshot()["state"] == "paused" and stats.snapshot()["paused_s"] == 4.0
    assert stats.snapshot()["paused_for_s"] == 4.0
    stats.pause_ends()
    assert stats.snapshot()["paused_for_s"] is None
    now[0] += 10.0
    stats.pause_begins("too many staged dumps")
    now[0] += 1.5
    assert stats.snapshot()["paused_s"] == 5.5 and stats.snapshot()["paused_for_s"] == 1.5
    stats.pause_ends()
    assert stats.summary()["paused_s"] == 5.5 and stats.snapshot()["paused_reason"] is None


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _stage(dump_dir, run_id: str, indices) -> None:
    for i in indices:
        (dump_dir / f"hsx-{run_id}-{i}").mkdir()


def test_the_staged_limit_is_exact_for_the_requests_this_client_sent_since_it_last_looked(tmp_path):
    clock = _Clock()  # never advances: the count is never refreshed by age
    bp = Backpressure(tmp_path, Watermark(bytes=0), max_staged=3, bytes_per_token=1, run_id="0123abcd", clock=clock)
    for i in range(3):
        assert bp.reason(inflight_requests=0) is None
        _stage(tmp_path, "0123abcd", [i])  # its reply staged a dump
    assert "3 staged dumps" in bp.reason(inflight_requests=0)


def test_dumps_the_drain_took_since_the_last_look_free_the_client_at_once(tmp_path):
    clock = _Clock()
    _stage(tmp_path, "0123abcd", range(3))
    bp = Backpressure(tmp_path, Watermark(bytes=0), max_staged=3, bytes_per_token=1, run_id="0123abcd", clock=clock)
    assert "drain is behind" in bp.reason()
    (tmp_path / "hsx-0123abcd-0").rmdir()  # the drain wrote one
    assert bp.reason() is None


def test_dumps_of_the_runs_other_client_processes_count_once_the_count_is_old(tmp_path):
    clock = _Clock()
    bp = Backpressure(tmp_path, Watermark(bytes=0), max_staged=4, bytes_per_token=1, run_id="0123abcd", clock=clock)
    assert bp.reason() is None
    _stage(tmp_path, "0123abcd", range(10, 14))  # another process of the run, on its sub-shard
    clock.now += RECOUNT_S
    assert "4 staged dumps" in bp.reason()


def test_a_client_stopped_at_the_staged_limit_sends_again_an_eighth_below_it(tmp_path):
    _stage(tmp_path, "0123abcd", range(16))
    bp = Backpressure(tmp_path, Watermark(bytes=0), max_staged=16, bytes_per_token=1, run_id="0123abcd", clock=_Clock())
    assert "drain is behind" in bp.reason()
    for i in range(2):  # the drain wrote two: below the limit, not yet an eighth below it
        (tmp_path / f"hsx-0123abcd-{i}").rmdir()
    assert "sending again below 14" in bp.reason(paused=True)
    (tmp_path / "hsx-0123abcd-2").rmdir()
    assert bp.reason(paused=True) is None


def test_a_client_that_was_not_paused_sends_up_to_the_limit_itself(tmp_path):
    _stage(tmp_path, "0123abcd", range(15))
    bp = Backpressure(tmp_path, Watermark(bytes=0), max_staged=16, bytes_per_token=1, run_id="0123abcd", clock=_Clock())
    assert bp.reason() is None


def test_a_paused_client_looks_again_within_20_ms_then_every_quarter_second_once_the_pause_lasts():
    assert pause_poll_s(0.0) == 0.02
    assert pause_poll_s(PAUSE_POLL_FAST_FOR_S - 0.01) == 0.02
    assert pause_poll_s(PAUSE_POLL_FAST_FOR_S) == 0.25
    assert pause_poll_s(3600.0) == 0.25
