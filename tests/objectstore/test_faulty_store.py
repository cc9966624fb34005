"""A store that misbehaves on purpose (support.faulty_store) between hsextract and a real server:
connections reset mid-upload and mid-download, 500 and 503 answers, answers later than the
client's timeout, bodies cut short, PUTs applied whose answers were lost. Under each fault, and
under a random mix over a few hundred samples, the drain, collect and pull make progress, lose
nothing, duplicate nothing, and end with a set that verifies and pulls byte for byte as a
directory drain of the same dumps wrote it; every retry is bounded and counted where a person
looks (the drain's status and log, `hsextract status`, collect's and pull's last lines)."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import pytest
from hsextract.objectstore.pull import pull
from hsextract.output.manifest import iter_entries
from hsextract.output.run_id import load_or_create_run_id
from support.bucket_sets import (
    assert_same_samples,
    assert_set_is_exact,
    drain,
    drain_fleet,
    published,
    staged_names,
    status_of,
    store_of,
    target,
    through,
)
from support.drain_proc import drain_args, finish_client, hsextract
from support.faulty_store import (
    ANSWER_LOST,
    CLIENT_TIMEOUT_S,
    FIRST_WAIT_S,
    KINDS,
    RESET_DOWNLOAD,
    RESET_UPLOAD,
    SLOW,
    STATUS_500,
    STATUS_503,
    TRUNCATED,
)
from support.staged_dumps import stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FMT = "speculators"
# What a drain's status calls the failures each fault makes: a 5xx without a body (a HEAD's) has
# no S3 code; botocore takes a listing or a multipart answer cut short in order for a 500; and a
# client under load may give up on an answer that was merely slow.
CAUSES = {
    RESET_UPLOAD: {"connection closed"},
    RESET_DOWNLOAD: {"connection closed", "answer cut short", "HTTP 500"},
    TRUNCATED: {"connection closed", "answer cut short", "HTTP 500"},
    STATUS_500: {"500 InternalError", "HTTP 500"},
    STATUS_503: {"503 SlowDown", "HTTP 503"},
    SLOW: {"no answer in time"},
    ANSWER_LOST: {"connection closed"},
}
BIG = 21_000  # tokens of a sample of three 5 MiB parts (hidden size 64, 4 rows a token, bf16)


def _stage_twice(tmp_path: Path, n: int, big: frozenset[int] = frozenset()) -> tuple[Path, Path, Path]:
    """`n` samples staged for a drain into a bucket, and the same dumps drained into a directory;
    (staging, work directory, the directory drain's output)."""
    dump, work, twin, directory = tmp_path / "dump", tmp_path / "work", tmp_path / "dump-dir", tmp_path / "set-dir"
    run = load_or_create_run_id(work)
    directory.mkdir()
    (directory / "run.json").write_text((work / "run.json").read_text())
    for i in range(n):
        tokens = BIG if i in big else 4 + i % 5
        stage_sample(dump, run, i, tokens=tokens)
        stage_sample(twin, run, i, tokens=tokens)
    assert drain(twin, directory, None, lines=n, fmt=FMT) == 0
    return dump, work, directory


def _store_args(endpoint: str, credentials: Path) -> list[str]:
    """A command's flags for the server at `endpoint` (a faulty store's: its slow answers given up on)."""
    timing = ["--s3-timeout", str(CLIENT_TIMEOUT_S), "--s3-first-wait", str(FIRST_WAIT_S)]
    return ["--s3-endpoint", endpoint, "--s3-credentials", str(credentials), *timing]


def _collect(into, work: Path, faulty, credentials: Path, *hosts: str) -> int:
    """``hsextract collect --into <into> NAME=URL...`` through `faulty`, in this process."""
    from hsextract.collect import command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = ["--into", str(into.url), "--work-dir", str(work), *_store_args(faulty.url, credentials), "--", *hosts]
    return command.run(parser.parse_args(args))


def _drain_cli(dump: Path, work: Path, url: str, faulty, credentials: Path, lines: int, *extra: str):
    """``hsextract drain --exit-when-done`` into `url` through `faulty`, as a unit runs it."""
    finish_client(work, lines)
    return hsextract(
        *drain_args(dump, work, FMT, "--exit-when-done", "--poll-interval", "0.1"),
        "--output",  # the last --output given is the one argparse keeps
        url,
        "--work-dir",
        str(work),
        *_store_args(faulty.url, credentials),
        *extra,
        timeout=300,
    )


@pytest.mark.parametrize("kind", KINDS)
def test_under_each_fault_the_drain_the_pull_and_the_collect_lose_nothing_and_match_a_directory_drain(
    kind, weed, bucket, credentials, faulty, tmp_path
):
    n = 10
    dump, work, directory = _stage_twice(tmp_path, n, big=frozenset({4}))
    out = through(faulty, bucket, "set", credentials, part_size=5 << 20)
    faulty.mix(seed=KINDS.index(kind), rate=0.1 if kind == SLOW else 0.2, kinds=(kind,))
    assert drain(dump, work, out, lines=n, fmt=FMT) == 0
    fired = faulty.fired_of(kind)
    assert fired >= 3, faulty.fired
    # Counted by what the client met (a 412 or a 404 whose body was cut short says enough, and is
    # no retry), never given up on.
    retries = status_of(work)["objectstore"]["retries"]
    assert retries["total"] >= 3 and retries["gave_up"] == 0, retries
    assert set(retries["by_cause"]) <= CAUSES[kind] | CAUSES[SLOW], retries
    assert staged_names(dump) == []
    assert_set_is_exact(target(weed, bucket, "set", credentials), set(range(n)))

    dest = tmp_path / "pulled"
    assert pull(store_of(out), dest)[0] == n  # through the same faults
    assert faulty.fired_of(kind) > fired, "the pull met the fault too"
    assert_same_samples(dest, directory)

    fired = faulty.fired_of(kind)
    into = target(weed, bucket, "collected", credentials)
    assert _collect(into, tmp_path / "collect-work", faulty, credentials, f"a=s3://{bucket}/set") == 0
    assert faulty.fired_of(kind) > fired, "the collect met the fault too"
    assert_set_is_exact(into, set(range(n)))  # each object read back against its line...
    want = {e.dataset_index: e.checksum for e in iter_entries(directory)}
    assert {e.dataset_index: e.checksum for e in published(into)} == want  # ... a directory drain's


def test_every_retry_is_counted_by_request_and_cause_in_the_drains_status_its_log_and_hsextract_status(
    bucket, credentials, faulty, tmp_path
):
    n = 6
    dump, work, _ = _stage_twice(tmp_path, n)
    faulty.inject(STATUS_500, method="PUT", key="/hidden_states/", count=2)
    faulty.inject(STATUS_503, method="HEAD", key="/hidden_states/", count=1)
    faulty.inject(ANSWER_LOST, method="PUT", key="/segments/", count=1)
    url = f"s3://{bucket}/counted"
    r = _drain_cli(dump, work, url, faulty, credentials, n)
    assert r.returncode == 0, r.stderr[-3000:]
    retries = status_of(work)["objectstore"]["retries"]
    assert retries["total"] == 4 and retries["gave_up"] == 0, retries
    assert retries["by_request"] == {"PUT": 3, "HEAD": 1}, retries
    assert retries["by_cause"] == {"500 InternalError": 2, "HTTP 503": 1, "connection closed": 1}, retries
    said = "4 retries (PUT 3, HEAD 1; 500 InternalError 2, HTTP 503 1, connection closed 1), at most 10 attempts"
    assert f"object store {url}: {said}" in r.stderr, [x for x in r.stderr.splitlines() if "object store" in x]
    status = hsextract("status", "--output", url, "--work-dir", str(work))
    assert status.returncode == 0, status.stdout
    assert said in status.stdout, status.stdout


def test_a_request_the_server_fails_every_time_stops_the_drain_after_its_attempts_and_loses_nothing(
    weed, bucket, credentials, faulty, tmp_path
):
    n = 4
    dump, work, _ = _stage_twice(tmp_path, n)
    url = f"s3://{bucket}/bounded"
    broken = faulty.inject(STATUS_503, method="PUT", key="/hidden_states/", count=math.inf)
    r = _drain_cli(dump, work, url, faulty, credentials, n, "--s3-attempts", "3")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "failed 3 times, the last: 503 SlowDown" in r.stderr, r.stderr[-3000:]
    assert "a request is tried at most 3 times (--s3-attempts)" in r.stderr
    assert len(staged_names(dump)) == n, "every sample is still staged"
    status = status_of(work)
    gave_up = status["objectstore"]["retries"]["gave_up"]
    assert status["state"] == "failed" and gave_up >= 1
    assert 3 <= broken.hits <= 3 * n, "no sample's PUT was tried more than three times"

    faulty.calm()
    again = _drain_cli(dump, work, url, faulty, credentials, n)
    assert again.returncode == 0, again.stderr[-3000:]
    assert_set_is_exact(target(weed, bucket, "bounded", credentials), set(range(n)))


def test_a_lost_answer_to_the_canarys_first_create_is_no_refusal_of_the_server(bucket, credentials, faulty, tmp_path):
    n = 3
    dump, work, _ = _stage_twice(tmp_path, n)
    faulty.inject(ANSWER_LOST, method="PUT", key="/canary/", count=1)
    assert drain(dump, work, through(faulty, bucket, "canary", credentials), lines=n, fmt=FMT) == 0
    assert faulty.fired_of(ANSWER_LOST) == 1


def test_an_error_answer_cut_short_is_tried_again_like_any_answer_cut_short(bucket, credentials, faulty, tmp_path):
    n = 3
    dump, work, _ = _stage_twice(tmp_path, n)
    # A new prefix: the drain's read of manifest.json meets a 404, whose body the reset cuts short.
    faulty.inject(RESET_DOWNLOAD, method="GET", key="/manifest.json$", count=1)
    assert drain(dump, work, through(faulty, bucket, "cut", credentials), lines=n, fmt=FMT) == 0
    assert status_of(work)["objectstore"]["retries"]["by_cause"] == {"answer cut short": 1}


def test_a_failed_put_of_a_dataset_level_file_is_tried_again_and_the_run_ends_with_the_files_published(
    weed, bucket, credentials, faulty, tmp_path
):
    n = 5
    dump, work, _ = _stage_twice(tmp_path, n)
    faulty.inject(STATUS_500, method="PUT", key=r"/(state\.json|\.hsextract/finalized\.json)$", count=2)
    assert drain(dump, work, through(faulty, bucket, "files", credentials), lines=n, fmt=FMT) == 0
    assert faulty.fired_of(STATUS_500) == 2
    finalized = store_of(target(weed, bucket, "files", credentials)).get_bytes("files/.hsextract/finalized.json")
    assert finalized is not None and json.loads(finalized)["samples"] == n
    assert status_of(work)["finalized_samples"] == n


def test_a_random_mix_of_faults_over_300_samples_drained_collected_and_pulled_loses_and_doubles_nothing(
    weed, bucket, credentials, faulty, tmp_path
):
    n, fleet = 300, tmp_path / "fleet"
    faulty.mix(seed=53, rate=0.05)
    # 20 attempts of a request (4 minutes of backoff): the proxy's faults are retried at once, and a
    # test machine that stalls the real server behind it for a while is waited for, not failed.
    attempts = ["--s3-attempts", "20"]
    staged = drain_fleet(weed, bucket, credentials, fleet, n=n, tokens=2, via=faulty, attempts=20)  # hosts a and b
    assert sorted(staged) == list(range(n))
    drained = faulty.fired.total()
    assert {kind for kind, _ in faulty.fired} == set(KINDS), faulty.fired
    into = target(weed, bucket, "run/set", credentials)
    collected = hsextract(
        "collect",
        "--into",
        str(into.url),
        "--work-dir",
        str(tmp_path / "set-work"),
        *_store_args(faulty.url, credentials),
        *attempts,
        "--",
        f"a=s3://{bucket}/run/a",
        f"b=s3://{bucket}/run/b",
        timeout=600,
    )
    assert collected.returncode == 0, collected.stderr[-3000:]
    assert faulty.fired.total() > drained, "the collect met faults too"
    assert re.search(r"^object store: \d+ retries \(", collected.stderr, re.M), collected.stderr[-2000:]
    assert_set_is_exact(into, set(range(n)))
    for host in ("a", "b"):
        said = hsextract("status", "--output", f"s3://{bucket}/run/{host}", "--work-dir", str(fleet / f"work-{host}"))
        assert re.search(r"object store +s3://\S+: \d+ retries \(", said.stdout), said.stdout

    pulled = tmp_path / "pulled"
    r = hsextract("pull", str(into.url), str(pulled), *_store_args(faulty.url, credentials), *attempts, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"pulled {n} samples" in r.stdout and re.search(r"object store .*: \d+ retries \(", r.stdout), r.stdout
    directory, twin = tmp_path / "set-dir", tmp_path / "dump-dir"
    directory.mkdir()
    run = load_or_create_run_id(fleet / "work-a")
    (directory / "run.json").write_text((fleet / "work-a" / "run.json").read_text())
    for i in range(n):  # the dumps the hosts drained, as drain_fleet staged them
        stage_sample(twin, run, i, tokens=2 + i % 16)
    assert drain(twin, directory, None, lines=n, fmt=FMT) == 0
    assert_same_samples(pulled, directory)
    verify = hsextract("finalize", "--output", str(into.url), *_store_args(weed.endpoint, credentials), "--verify")
    assert verify.returncode == 0 and f"verified {n}/{n} samples" in verify.stdout, verify.stdout[-2000:]
