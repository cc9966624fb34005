"""The client's start-up clock: each phase's seconds, in order, from the process's own start."""

import time

import pytest
from hsextract.client.startup import StartupClock
from hsextract.process_age import process_age_s


def test_the_process_age_counts_from_the_process_start_not_from_the_clock_s_creation():
    before = time.monotonic()
    age = process_age_s()
    # This test process started before this test did: its age exceeds the time this test has run.
    assert age is not None and age > time.monotonic() - before
    assert process_age_s() >= age


def test_phases_are_recorded_in_the_order_they_ran_after_the_process_and_imports():
    clock = StartupClock()
    with clock.phase("tokenizer"):
        pass
    with clock.phase("probe"):
        pass
    assert list(clock.phases) == ["process_and_imports", "tokenizer", "probe"]
    assert clock.total_s() == round(sum(clock.phases.values()), 2)


def test_a_phase_that_raises_is_recorded_all_the_same():
    clock = StartupClock()
    with pytest.raises(RuntimeError), clock.phase("server_wait"):
        raise RuntimeError("the server did not answer")
    assert "server_wait" in clock.phases


def test_the_log_line_names_the_total_and_each_phase():
    clock = StartupClock()
    clock.phases = {"process_and_imports": 3.21, "tokenizer": 5.0, "probe": 0.17}
    assert clock.describe() == (
        "8.4 s before the first sample (process and imports 3.2 s, tokenizer 5.0 s, probe 0.2 s)"
    )
