"""The texts people read about a run: `hsextract status`, the play's summary, the client's lines."""

from __future__ import annotations

import pytest
from hsextract.output.layout import ProblemFiles
from hsextract.report import RunView, client_lines, progress_line, status_lines
from hsextract.units import count, duration, rate, seconds, size

FILES = ProblemFiles(
    rejected="/out/.hsextract/rejects.jsonl", failed="/out/.hsextract/failures.jsonl", quarantined="/out/quarantine"
)
DRAIN_DONE = {
    "state": "running",
    "format": "speculators",
    "samples": 40,
    "samples_total": 40,
    "tokens": 6551,
    "tokens_total": 6551,
    "bytes": 48_123_456,
    "bytes_total": 48_123_456,
    "mb_per_s": 0.0,
    "lag": 0,
    "in_flight": 0,
    "quarantined": 0,
    "quarantined_by_reason": {},
    "paused_reason": "",
}
CLIENT_DONE = {
    "state": "done",
    "samples_total": 40,
    "sent": 40,
    "ok": 40,
    "skipped": 0,
    "truncated": 0,
    "failed": 0,
    "rejected": 0,
    "failed_by_reason": {},
    "rejected_by_reason": {},
    "in_flight": 0,
    "tokens": 6551,
    "tokens_per_s": 93.4,
    "eta_s": 0.0,
    "paused_reason": None,
    "started_at": 1_000.0,
    "updated_at": 1_065.5,
}
CLIENT_RUNNING = {
    **CLIENT_DONE,
    "state": "running",
    "samples_total": 40_000,
    "ok": 1_200,
    "skipped": 10,
    "failed": 3,
    "rejected": 15,
    "failed_by_reason": {"server_error": 2, "timeout": 1},
    "rejected_by_reason": {"bad_json": 4, "template_not_incremental": 11},
    "in_flight": 8,
    "tokens": 5_432_100,
    "tokens_per_s": 1_234.5,
    "eta_s": 11_400.0,
    "updated_at": 4_600.0,
}
DRAIN_RUNNING = {
    **DRAIN_DONE,
    "samples_total": 1_190,
    "tokens_total": 5_400_000,
    "bytes_total": 12_345_678_901,
    "mb_per_s": 45.64,
    "lag": 12,
    "quarantined": 2,
    "quarantined_by_reason": {"token_mismatch": 2},
}


def view(drain=DRAIN_DONE, client=CLIENT_DONE, healthy=True, health="drain running, updated 2 s ago", now=1_100.0):
    return RunView(output="/out", files=FILES, drain=drain, client=client, healthy=healthy, health=health, now=now)


def test_a_finished_run_reads_as_a_sentence_and_a_table():
    assert status_lines(view()) == [
        "The run is done: 40 samples are in the training set.",
        "  training set   /out (speculators)",
        "  drain          running, updated 2 s ago",
        "  samples        40 in the set; the client answered 40 and skipped 0 of 40",
        "  tokens         6,551 in the set",
        "  written        48.1 MB",
        "  rate           100 tokens/s on average",
        "  elapsed        1 min 06 s",
        "  ETA            done",
        "  staged         0 waiting for the drain, 0 requests in flight",
        "  rejected       0",
        "  failed         0",
        "  quarantined    0",
    ]


def test_a_running_run_lists_each_problem_by_reason_with_the_file_that_holds_them():
    assert status_lines(view(DRAIN_RUNNING, CLIENT_RUNNING, now=4_600.0)) == [
        "The run is going: 1,228 of 40,000 samples done, ETA 3 h 10 min.",
        "  training set   /out (speculators)",
        "  drain          running, updated 2 s ago",
        "  samples        1,190 in the set; the client answered 1,200 and skipped 10 of 40,000",
        "  tokens         5,400,000 in the set",
        "  written        12.35 GB",
        "  rate           1,234 tokens/s; the drain writes 45.6 MB/s",
        "  elapsed        1 h 00 min",
        "  ETA            3 h 10 min",
        "  staged         12 waiting for the drain, 8 requests in flight",
        "  rejected       15, listed in /out/.hsextract/rejects.jsonl",
        "                   template_not_incremental  11",
        "                   bad_json                   4",
        "  failed         3, listed in /out/.hsextract/failures.jsonl",
        "                   server_error  2",
        "                   timeout       1",
        "  quarantined    2, listed in /out/quarantine/<rid>/reason.txt",
        "                   token_mismatch  2",
    ]


@pytest.mark.parametrize(
    ("client", "healthy", "health", "expected"),
    [
        (
            CLIENT_DONE,
            False,
            "drain status is stale: last update 10 min 00 s ago (limit 1 min 00 s)",
            "FAIL: drain status is stale: last update 10 min 00 s ago (limit 1 min 00 s).",
        ),
        (
            None,
            True,
            "drain running, updated 1 s ago",
            "The client has not started yet; 40 samples are in the training set.",
        ),
        (
            {**CLIENT_RUNNING, "state": "paused", "paused_reason": "/dev/shm below 10% free"},
            True,
            "",
            "The run is paused (/dev/shm below 10% free): 1,228 of 40,000 samples done.",
        ),
        (
            {**CLIENT_RUNNING, "state": "paused", "paused_reason": "/dev/shm below 10% free", "paused_for_s": 127.4},
            True,
            "",
            "The run is paused for 2 min 07 s (/dev/shm below 10% free): 1,228 of 40,000 samples done.",
        ),
        (
            {**CLIENT_RUNNING, "state": "failed", "error": "server down for 3600 s"},
            True,
            "",
            "The client failed: server down for 3600 s.",
        ),
        (
            {**CLIENT_RUNNING, "state": "stopped"},
            True,
            "",
            "The client was stopped after 1,228 of 40,000 samples; run it again to resume.",
        ),
    ],
)
def test_the_headline_says_where_the_run_stands(client, healthy, health, expected):
    assert status_lines(view(client=client, healthy=healthy, health=health))[0] == expected


def test_a_finished_run_that_fails_its_check_says_why_under_the_headline_and_shows_its_counts():
    v = RunView(
        output="/out",
        files=FILES,
        drain=DRAIN_DONE,
        client=CLIENT_DONE,
        health="drain done 1 s ago",
        problems=["2 of 40 accepted samples failed (5.0%, more than the allowed 1.0%): timeout 2"],
        counts=[
            "40 dataset lines = 40 accepted + 0 rejected",
            "40 accepted = 38 in the set + 2 failed + 0 quarantined",
        ],
    )
    lines = status_lines(v)
    assert lines[:2] == [
        "The run is done: 40 samples are in the training set.",
        "FAIL: 2 of 40 accepted samples failed (5.0%, more than the allowed 1.0%): timeout 2.",
    ]
    assert lines[-2:] == [
        "  counts         40 dataset lines = 40 accepted + 0 rejected",
        "                 40 accepted = 38 in the set + 2 failed + 0 quarantined",
    ]


def test_stale_dumps_the_drain_removed_are_listed_by_reason_only_when_there_are_some():
    drain = {**DRAIN_DONE, "stale_removed": 3, "stale_removed_by_reason": {"from another run": 2, "already written": 1}}
    assert status_lines(view(drain=drain))[-3:] == [
        "  stale removed   3, listed in the drain's journal",
        "                    from another run  2",
        "                    already written   1",
    ]
    assert not any("stale" in line for line in status_lines(view()))


def test_a_finished_client_whose_dumps_still_wait_for_the_drain_is_not_a_finished_run():
    assert status_lines(view(drain={**DRAIN_DONE, "samples_total": 37, "lag": 3}))[0] == (
        "The client is done: 37 samples are in the training set, 3 samples still wait for the drain."
    )
    assert status_lines(view(drain={**DRAIN_DONE, "samples_total": 39, "lag": 1}))[0] == (
        "The client is done: 39 samples are in the training set, 1 sample still waits for the drain."
    )
    # A drain that is done stopped with staging empty, whatever its last scan counted.
    assert status_lines(view(drain={**DRAIN_DONE, "state": "done", "lag": 1}))[0] == (
        "The run is done: 40 samples are in the training set."
    )


def test_a_drain_paused_on_a_full_volume_is_not_a_finished_run():
    paused = {
        **DRAIN_DONE,
        "state": "paused",
        "samples_total": 16,
        "lag": 14,
        "paused_reason": "output volume full: /out has 4096 bytes free (No space left on device); retrying every 5 s",
    }
    assert status_lines(view(drain=paused))[0] == (
        "The client is done, but the drain is paused (output volume full: /out has 4096 bytes free (No space left "
        "on device); retrying every 5 s): 16 samples are in the training set, 14 samples still wait for the drain."
    )


def test_a_run_whose_dataset_level_files_lag_behind_the_set_is_not_done():
    v = RunView(
        output="/out",
        files=FILES,
        drain=DRAIN_DONE,
        client=CLIENT_DONE,
        health="drain done 1 s ago",
        dataset_files=(26, 40),
    )
    assert status_lines(v)[0] == (
        "The client is done and 40 samples are in the training set, but the dataset-level files cover 26 of them."
    )
    current = RunView(output="/out", files=FILES, drain=DRAIN_DONE, client=CLIENT_DONE, dataset_files=(40, 40))
    assert status_lines(current)[0] == "The run is done: 40 samples are in the training set."


def test_the_table_takes_the_problems_from_the_runs_files_as_the_counts_do():
    """The drain's status counts what its last process did; the counts read the run's files."""
    accounts = {"rejected": {"bad_json": 1}, "failed": {}, "quarantined": {"incomplete": 2}}
    v = RunView(
        output="/out",
        files=FILES,
        drain={**DRAIN_DONE, "quarantined": 1, "quarantined_by_reason": {"incomplete": 1}},
        client=CLIENT_DONE,
        accounts=accounts,
        counts=[
            "41 dataset lines = 40 accepted + 1 rejected",
            "40 accepted = 38 in the set + 0 failed + 2 quarantined",
        ],
    )
    lines = status_lines(v)
    assert "  quarantined    2, listed in /out/quarantine/<rid>/reason.txt" in lines
    assert "                   incomplete  2" in lines
    assert "  rejected       1, listed in /out/.hsextract/rejects.jsonl" in lines


def test_a_message_that_ends_its_own_sentence_gets_no_second_full_stop():
    v = RunView(
        output="/out",
        files=FILES,
        drain=DRAIN_DONE,
        client={**CLIENT_DONE, "state": "failed", "error": "the server is gone."},
        problems=["the client's start was refused: pass --dataset with the data."],
    )
    lines = status_lines(v)
    assert lines[0] == "The client failed: the server is gone."
    assert lines[1] == "FAIL: the client's start was refused: pass --dataset with the data."


def test_the_status_of_a_drain_that_has_not_written_yet_shows_dashes_not_errors():
    lines = status_lines(view(drain=None, client=None, healthy=False, health="no drain status file (is it running?)"))
    assert lines[0] == "FAIL: no drain status file (is it running?)."
    assert "  tokens         -" in lines and "  written        -" in lines and "  quarantined    0" in lines


def test_the_client_closes_with_what_it_did_and_what_it_could_not():
    assert client_lines({**CLIENT_RUNNING, "state": "done", "samples_total": 1_228}, FILES) == [
        "The client is done: 1,228 of 1,228 samples have an outcome, 1,200 answered in 1 h 00 min "
        "(5,432,100 tokens, 1,509 tokens/s).",
        "  skipped     10 already written or staged by an earlier run",
        "  truncated   0",
        "  rejected    15, listed in /out/.hsextract/rejects.jsonl",
        "                template_not_incremental  11",
        "                bad_json                   4",
        "  failed      3, listed in /out/.hsextract/failures.jsonl",
        "                server_error  2",
        "                timeout       1",
    ]


def test_a_failed_client_says_why():
    lines = client_lines({**CLIENT_DONE, "state": "failed", "ok": 2, "error": "server down for 3600 s"}, FILES)
    assert lines[:2] == [
        "The client failed: 2 of 40 samples have an outcome, 2 answered in 1 min 06 s (6,551 tokens, 100 tokens/s).",
        "Error: server down for 3600 s",
    ]


def test_the_progress_line_reads_as_a_sentence():
    assert progress_line(CLIENT_RUNNING) == (
        "1,228 of 40,000 samples done (1,200 answered, 10 skipped, 3 failed, 15 rejected), 1,234 tokens/s, "
        "ETA 3 h 10 min"
    )
    paused = {**CLIENT_RUNNING, "paused_reason": "12 dumps staged", "eta_s": None}
    assert progress_line(paused).endswith("ETA -; paused: 12 dumps staged")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0, "0 s"),
        (45.4, "45 s"),
        (59.6, "1 min 00 s"),
        (127, "2 min 07 s"),
        (3_600, "1 h 00 min"),
        (11_400, "3 h 10 min"),
        (172_800 + 7 * 3_600 + 59, "2 d 7 h"),
    ],
)
def test_durations_read_in_the_largest_sensible_units(seconds, text):
    assert duration(seconds) == text


def test_counts_and_sizes_carry_separators_and_units():
    assert (count(6551), count(None), count(1508.9)) == ("6,551", "-", "1,509")
    assert (size(48_123_456), size(12_345_678_901), size(None)) == ("48.1 MB", "12.35 GB", "-")


@pytest.mark.parametrize(
    ("timing", "text"),
    [(None, "-"), (0.42, "0.4 s"), (8.44, "8.4 s"), (59.94, "59.9 s"), (59.96, "1 min 00 s"), (127.2, "2 min 07 s")],
)
def test_short_timings_keep_their_tenth_until_a_minute(timing, text):
    assert seconds(timing) == text


def test_rates_read_in_the_units_of_sizes():
    assert (rate(48_123_456), rate(1_234_567_890), rate(None)) == ("48.1 MB/s", "1.23 GB/s", "-")
