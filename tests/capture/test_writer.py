"""The writer stages rows exactly, in parallel, without unbounded memory, and survives write errors.

The tests that take a ``mode`` run twice: with the writer's threads in the calling process
(``in_process``, the default) and with the writing done by a child process (``writer_process``).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time

import pytest
import torch
from hsextract import fingerprint
from hsextract.capture.core import BatchRequest
from hsextract.capture.host_stage import HostBufferPool, own_batch
from hsextract.staging.dumps import (
    CAPTURE_FINGERPRINT,
    CAPTURE_QUEUE_ERROR,
    CAPTURE_SERVER_ABORTED,
    DONE_FILE,
    FAILED_FILE,
    STATES_FILE,
    iter_complete,
    read_done_marker,
    read_failed_marker,
    read_states,
)
from support.capture_writers import MODES, H, K, batch, make_writer

pytestmark = pytest.mark.slow


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


def expected_rows(aux, final):
    return torch.cat([aux.view(-1, K, H), final.view(-1, 1, H)], 1)


def test_chunks_of_several_batches_are_stitched_into_one_exact_file(tmp_path, mode):
    w = make_writer(tmp_path, mode)
    rid = "hsx-ab12cd34-0"
    aux, final, ids = batch(40, seed=1)
    try:
        for start, n in [(0, 16), (16, 16), (32, 8)]:
            w.submit(
                [BatchRequest(rid, 0, start, n, 0)],
                aux[start : start + n],
                final[start : start + n],
                ids[start : start + n],
                [40],
            )
        assert w.flush(timeout=30)
    finally:
        w.close()
    st = read_states(tmp_path / rid)
    assert torch.equal(st.hidden, expected_rows(aux, final))
    assert torch.equal(st.input_ids, ids)
    assert read_done_marker(tmp_path / rid).chunks == [[0, 16], [16, 16], [32, 8]]


def test_requests_packed_in_one_batch_land_in_their_own_files(tmp_path, mode):
    w = make_writer(tmp_path, mode)
    aux, final, ids = batch(30, seed=2)
    reqs = [BatchRequest("hsx-ab12cd34-0", 0, 0, 10, 0), BatchRequest("hsx-ab12cd34-2", 14, 0, 16, 2)]
    try:
        w.submit(reqs, aux, final, ids, [10, 4, 16])  # the request at index 1 is not ours
        assert w.flush(timeout=30)
    finally:
        w.close()
    exp = expected_rows(aux, final)
    a = read_states(tmp_path / "hsx-ab12cd34-0")
    b = read_states(tmp_path / "hsx-ab12cd34-2")
    assert torch.equal(a.hidden, exp[:10]) and torch.equal(a.input_ids, ids[:10])
    assert torch.equal(b.hidden, exp[14:30]) and torch.equal(b.input_ids, ids[14:30])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hsx-ab12cd34-0", "hsx-ab12cd34-2"]


def test_a_long_request_is_written_by_several_threads(tmp_path):
    w = make_writer(tmp_path, num_threads=4, slice_bytes=4096)  # 32 rows per slice
    seen: set[str] = set()
    real = w._write_slice_task

    def spy(*args, **kw):
        seen.add(threading.current_thread().name)
        time.sleep(0.01)
        return real(*args, **kw)

    w._write_slice_task = spy
    aux, final, ids = batch(1024, seed=3)
    try:
        w.submit([BatchRequest("hsx-ab12cd34-0", 0, 0, 1024, 0)], aux, final, ids, [1024])
        assert w.flush(timeout=30)
    finally:
        w.close()
    assert len(seen) > 1
    st = read_states(tmp_path / "hsx-ab12cd34-0")
    assert torch.equal(st.hidden, expected_rows(aux, final)) and torch.equal(st.input_ids, ids)


def test_a_stale_done_marker_of_an_earlier_run_is_removed_when_the_rid_restarts(tmp_path, mode):
    rid = "hsx-ab12cd34-0"
    (tmp_path / rid).mkdir()
    (tmp_path / rid / DONE_FILE).write_text("{}")
    w = make_writer(tmp_path, mode)
    aux, final, ids = batch(8, seed=4)
    try:
        w.submit([BatchRequest(rid, 0, 0, 8, 0)], aux, final, ids, [16])  # half of the prompt
        assert w.flush(timeout=30)
    finally:
        w.close()
    assert not (tmp_path / rid / DONE_FILE).exists()


def test_pool_blocks_when_the_byte_budget_is_spent_and_says_so(caplog):
    pool = HostBufferPool(max_bytes=4 << 20, pin=False, granularity=1 << 20)
    a = pool.acquire(3 << 20)
    got = []
    t = threading.Thread(target=lambda: got.append(pool.acquire(2 << 20)))
    with caplog.at_level(logging.WARNING, logger="hsextract.capture"):
        t.start()
        deadline = time.monotonic() + 30
        while pool.blocked_count == 0 and time.monotonic() < deadline:  # until the acquirer waits
            time.sleep(0.01)
        assert not got, "the pool handed out more than its budget"
        pool.release(a)
        t.join(timeout=5)
    assert got and pool.blocked_count == 1
    assert any("capture blocked" in r.message for r in caplog.records)


def test_pool_serves_an_oversized_request_when_nothing_else_is_in_use():
    pool = HostBufferPool(max_bytes=1 << 20, pin=False)
    buf = pool.acquire(3 << 20)
    assert buf.numel() >= 3 << 20


def test_pool_reuses_buffers():
    pool = HostBufferPool(max_bytes=64 << 20, pin=False)
    a = pool.acquire(5 << 20)
    pool.release(a)
    b = pool.acquire(4 << 20)
    assert b.data_ptr() == a.data_ptr()


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 1 MiB tmpfs of our own, to fill up (needs root and mount; skipped without them)."""
    mnt = tmp_path / "shm"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_ramdisk_is_logged_with_the_path_and_never_marked_done(tiny_tmpfs, caplog, capfd, mode):
    w = make_writer(tiny_tmpfs, mode, slice_bytes=64 << 10, map_margin_bytes=0)
    big, small = "hsx-ab12cd34-0", "hsx-ab12cd34-1"
    aux, final, ids = batch(12000, seed=5)  # 12000 rows x 128 B = 1.5 MB > 1 MiB
    with caplog.at_level(logging.ERROR, logger="hsextract.capture"):
        try:
            w.submit([BatchRequest(big, 0, 0, 12000, 0)], aux, final, ids, [12000])
            assert w.flush(timeout=30)
            # The server goes on: a later small request is still captured once space is back.
            w.submit([BatchRequest(small, 0, 0, 8, 0)], aux[:8], final[:8], ids[:8], [8])
            assert w.flush(timeout=30)
        finally:
            w.close()
    assert not (tiny_tmpfs / big / DONE_FILE).exists()
    assert not (tiny_tmpfs / big / STATES_FILE).exists(), "the partial file should be removed to free space"
    # In the writer process's mode the error is in the child's stderr (the server's log).
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    errors += [line for line in capfd.readouterr().err.splitlines() if " ERROR " in line]
    assert any(str(tiny_tmpfs / big / STATES_FILE) in m and "No space left" in m for m in errors), errors
    assert w.write_errors == 1
    assert [p.name for p in iter_complete(tiny_tmpfs)] == [small]


def test_unwritable_dump_dir_is_logged_and_never_marked_done(tmp_path, caplog, capfd, mode):
    if os.geteuid() == 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        r = subprocess.run(["mount", "--bind", "-o", "ro", str(ro), str(ro)], capture_output=True)
        if r.returncode != 0:
            pytest.skip("cannot make a read-only directory as root here")
        cleanup = ["umount", str(ro)]
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        cleanup = None
    w = make_writer(ro, mode)
    aux, final, ids = batch(8, seed=6)
    try:
        with caplog.at_level(logging.ERROR, logger="hsextract.capture"):
            w.submit([BatchRequest("hsx-ab12cd34-0", 0, 0, 8, 0)], aux, final, ids, [8])
            assert w.flush(timeout=30)
        w.close()
        assert not (ro / "hsx-ab12cd34-0" / DONE_FILE).exists()
        logged = [r.getMessage() for r in caplog.records] + capfd.readouterr().err.splitlines()
        assert any(str(ro / "hsx-ab12cd34-0") in m for m in logged), logged
    finally:
        if cleanup:
            subprocess.run(cleanup, check=False)
        shutil.rmtree(ro, ignore_errors=True)


def test_a_batch_of_many_short_requests_lands_each_request_whole_and_exact(tmp_path, mode):
    """Short prompts come hundreds to a batch; the writer groups them into a few tasks, and every
    one still lands in its own complete file."""
    w = make_writer(tmp_path, mode, num_threads=3)
    n, rows = 37, 5
    aux, final, ids = batch(n * rows, seed=7)
    reqs = [BatchRequest(f"hsx-ab12cd34-{i}", i * rows, 0, rows, i) for i in range(n)]
    try:
        w.submit(reqs, aux, final, ids, [rows] * n)
        assert w.flush(timeout=30)
    finally:
        w.close()
    exp = expected_rows(aux, final)
    assert w.requests_done == n and w.requests_failed == 0
    for i in range(n):
        st = read_states(tmp_path / f"hsx-ab12cd34-{i}")
        assert torch.equal(st.hidden, exp[i * rows : (i + 1) * rows])
        assert torch.equal(st.input_ids, ids[i * rows : (i + 1) * rows])
        assert read_done_marker(tmp_path / f"hsx-ab12cd34-{i}").chunks == [[0, rows]]


def test_a_batch_the_forward_pass_could_not_hand_over_leaves_failed_json_and_its_later_chunks_are_ignored(
    tmp_path, mode
):
    w = make_writer(tmp_path, mode)
    failed, fine = "hsx-ab12cd34-0", "hsx-ab12cd34-1"
    aux, final, ids = batch(40, seed=8)
    try:
        w.fail_requests([BatchRequest(failed, 0, 0, 16, 0)], CAPTURE_QUEUE_ERROR, "RuntimeError: no room")
        w.submit(
            [BatchRequest(failed, 0, 16, 16, 0), BatchRequest(fine, 16, 0, 8, 1)],
            aux[:24],
            final[:24],
            ids[:24],
            [40, 8],
        )  # the failed request's second chunk, and a whole request beside it
        assert w.flush(timeout=30)
    finally:
        w.close()
    marker = read_failed_marker(tmp_path / failed)
    assert marker is not None and marker.reason == CAPTURE_QUEUE_ERROR and "no room" in marker.detail
    assert not (tmp_path / failed / DONE_FILE).exists() and not (tmp_path / failed / STATES_FILE).exists()
    assert not (tmp_path / fine / FAILED_FILE).exists()
    assert torch.equal(read_states(tmp_path / fine).hidden, expected_rows(aux, final)[16:24])


def test_a_send_aborted_midway_and_sent_again_from_row_0_stages_the_second_send_alone(tmp_path, mode):
    """The client died after two of three chunks (SGLang aborted the request; the capture is not
    told); the restarted client sends the rid again, whose rows differ here: the dump is the second
    send's, and its done.json's fingerprint matches the file, so the drain accepts it."""
    w = make_writer(tmp_path, mode)
    rid = "hsx-ab12cd34-0"
    aborted, again = batch(40, seed=11), batch(40, seed=12)
    try:
        for (aux, final, ids), chunks in ((aborted, [(0, 16), (16, 16)]), (again, [(0, 16), (16, 16), (32, 8)])):
            for start, n in chunks:
                w.submit(
                    [BatchRequest(rid, 0, start, n, 0)],
                    aux[start : start + n],
                    final[start : start + n],
                    ids[start : start + n],
                    [40],
                )
            assert w.flush(timeout=30)
    finally:
        w.close()
    st = read_states(tmp_path / rid)
    aux, final, ids = again
    assert torch.equal(st.hidden, expected_rows(aux, final)) and torch.equal(st.input_ids, ids)
    marker = read_done_marker(tmp_path / rid)
    assert marker.chunks == [[0, 16], [16, 16], [32, 8]]
    assert marker.fingerprint == fingerprint.of_states(st.hidden, st.input_ids)
    assert not (tmp_path / rid / FAILED_FILE).exists()


def test_done_json_carries_the_fingerprint_of_the_staged_rows_and_the_greedy_token(tmp_path, mode):
    w = make_writer(tmp_path, mode)
    rid = "hsx-ab12cd34-0"
    aux, final, ids = batch(40, seed=11)
    try:
        for start, n, token in [(0, 16, 5), (16, 16, 6), (32, 8, 42)]:  # chunks: only the last one's token counts
            w.submit(
                [BatchRequest(rid, 0, start, n, 0)],
                aux[start : start + n],
                final[start : start + n],
                ids[start : start + n],
                [40],
                tokens=torch.tensor([token]),
            )
        assert w.flush(timeout=30)
    finally:
        w.close()
    marker = read_done_marker(tmp_path / rid)
    st = read_states(tmp_path / rid)
    assert marker.fingerprint == fingerprint.of_states(st.hidden, st.input_ids)
    assert marker.greedy_token == 42


def test_rows_that_differ_from_the_forward_pass_values_are_failed_not_staged(tmp_path, mode):
    """The writer recomputes each row's fingerprint value from its host copy: a copy that landed
    other bytes than the forward pass computed is failed (the client sends it again)."""
    w = make_writer(tmp_path, mode)
    bad, good = "hsx-ab12cd34-0", "hsx-ab12cd34-1"
    aux, final, ids = batch(24, seed=12)
    settings_ = w.settings
    reqs = [BatchRequest(bad, 0, 0, 8, 0), BatchRequest(good, 8, 0, 16, 1)]
    owned = own_batch(settings_, reqs, aux, final, ids, [8, 16])
    owned.row_values[3] += 1  # what a copy that read changed memory looks like to the writer
    try:
        w.submit_owned(owned)
        assert w.flush(timeout=30)
    finally:
        w.close()
    failed = read_failed_marker(tmp_path / bad)
    assert failed is not None and failed.reason == CAPTURE_FINGERPRINT and "prompt row 3" in failed.detail
    assert not (tmp_path / bad / DONE_FILE).exists() and not (tmp_path / bad / STATES_FILE).exists()
    assert read_done_marker(tmp_path / good).rid == good


def test_sglangs_one_token_placeholder_of_a_refused_request_is_failed_not_marked_done(tmp_path, mode):
    """SGLang runs a refused request (a prompt longer than it accepts) as the single token 0: that
    is no sample, and the drain must not wait for its record or take it for a token mismatch."""
    w = make_writer(tmp_path, mode)
    rid = "hsx-ab12cd34-7"
    aux, final, _ = batch(1, seed=13)
    try:
        w.submit([BatchRequest(rid, 0, 0, 1, 0)], aux, final, torch.tensor([0]), [1])
        assert w.flush(timeout=30)
    finally:
        w.close()
    failed = read_failed_marker(tmp_path / rid)
    assert failed is not None and failed.reason == CAPTURE_SERVER_ABORTED
    assert not (tmp_path / rid / DONE_FILE).exists()
