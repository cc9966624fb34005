"""The writer process: a dead child loses no request silently, and shared buffers leak nothing.

The writing itself (whole, chunked and failed requests, write errors) is tested in both modes by
test_writer.py; here are what only the writer process has: its death, and its shared memory.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hsextract.capture import wire
from hsextract.capture.core import BatchRequest, CaptureSettings
from hsextract.capture.shared_buffers import MEMFD_NAME
from hsextract.capture.sink import WriterOptions
from hsextract.capture.writer_process import ProcessCaptureWriter
from hsextract.layers import resolve
from hsextract.staging.dumps import (
    CAPTURE_MISSING_ROWS,
    CAPTURE_WRITER_DIED,
    DONE_FILE,
    FAILED_FILE,
    STATES_FILE,
    read_failed_marker,
    read_states,
)

pytestmark = pytest.mark.slow

H = 16
K = 3
ROW_BYTES = (K + 1) * H * 2


def settings() -> CaptureSettings:
    return CaptureSettings(rid_prefix="hsx", layers=resolve(None, 8), hidden_size=H, architecture="LlamaForCausalLM")


def rows(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, K * H, generator=g).to(torch.bfloat16),
        torch.randn(n, H, generator=g).to(torch.bfloat16),
        torch.randint(0, 300, (n,), generator=g),
    )


def expected(aux, final):
    return torch.cat([aux.view(-1, K, H), final.view(-1, 1, H)], 1)


def wait_until(what: str, condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.01)


def submit_whole(w: ProcessCaptureWriter, rid: str, n: int, seed: int):
    aux, final, ids = rows(n, seed)
    w.submit([BatchRequest(rid, 0, 0, n, 0)], aux, final, ids, [n])
    return aux, final, ids


def memfd_mappings(pid: int | str = "self") -> int:
    return sum(MEMFD_NAME in line for line in Path(f"/proc/{pid}/maps").read_text().splitlines())


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_messages_survive_the_wire_whole_and_in_pieces():
    batch = wire.batch_message(3, 16, 128, 2048, 1, [BatchRequest("hsx-a-0", 0, 0, 16, 0)])
    stream = bytearray(wire.encode(batch) + wire.encode(wire.Flush(7)))
    part = bytearray(stream[:5])
    assert wire.decode(part) is None and part == stream[:5], "an incomplete message stays in the buffer"
    got = wire.decode(stream)
    assert got == batch and got.batch_requests() == [BatchRequest("hsx-a-0", 0, 0, 16, 0)]
    assert wire.decode(stream) == wire.Flush(7) and not stream


def test_a_killed_writer_process_leaves_done_or_failed_json_for_every_request(tmp_path, caplog):
    """Killed while it holds four batches it has not written: those requests get failed.json
    (writer_died), what it wrote before stays done, and later batches are written in-process."""
    w = ProcessCaptureWriter(tmp_path, settings(), WriterOptions(pool_granularity=1024), device="cpu")
    before, lost, after = "hsx-ab12cd34-0", [f"hsx-ab12cd34-{i}" for i in range(1, 5)], "hsx-ab12cd34-5"
    chunked = "hsx-ab12cd34-9"  # its first chunk written by the child, its second after the death
    aux, final, ids = rows(40, seed=1)
    with caplog.at_level(logging.ERROR, logger="hsextract.capture"):
        try:
            submit_whole(w, before, 8, seed=2)
            w.submit([BatchRequest(chunked, 0, 0, 16, 0)], aux[:16], final[:16], ids[:16], [40])
            assert w.flush(timeout=60)
            os.kill(w.child_pid, signal.SIGSTOP)  # it takes the next batches and writes none of them
            for i, rid in enumerate(lost):
                submit_whole(w, rid, 8, seed=10 + i)
            wait_until("the stopped child was sent the four batches", lambda: w.batches_handed_over == 6)
            os.kill(w.child_pid, signal.SIGKILL)
            wait_until("the parent writes in-process", lambda: w.writing_in_process)
            a_aux, a_final, a_ids = submit_whole(w, after, 12, seed=20)
            w.submit([BatchRequest(chunked, 0, 16, 24, 0)], aux[16:], final[16:], ids[16:], [40])
            assert w.flush(timeout=60)
        finally:
            w.close()
    assert (tmp_path / before / DONE_FILE).exists()
    for rid in lost:
        marker = read_failed_marker(tmp_path / rid)
        assert marker is not None and marker.reason == CAPTURE_WRITER_DIED, rid
        assert str(w.child_pid) in marker.detail and "SIGKILL" in marker.detail
        assert not (tmp_path / rid / DONE_FILE).exists() and not (tmp_path / rid / STATES_FILE).exists()
    st = read_states(tmp_path / after)
    assert torch.equal(st.hidden, expected(a_aux, a_final)) and torch.equal(st.input_ids, a_ids)
    marker = read_failed_marker(tmp_path / chunked)
    assert marker is not None and marker.reason == CAPTURE_MISSING_ROWS, "its first rows died with the child"
    assert not (tmp_path / chunked / STATES_FILE).exists()
    errors = [r.getMessage() for r in caplog.records]
    assert any(
        f"writer process (pid {w.child_pid}) died (killed by signal 9 (SIGKILL))" in m and "4 requests" in m
        for m in errors
    ), errors


def test_shared_buffers_are_reused_unmapped_when_dropped_and_leave_no_descriptor(tmp_path):
    # This process ran other tests: their writers' buffers, garbage now, are collected before counting.
    gc.collect()
    fds_before, maps_before = open_fds(), memfd_mappings()
    granule = 1024
    # One 2 KiB buffer for batches of up to 2 KiB, and a budget of 16 KiB: a 16 KiB batch must
    # drop the free 2 KiB buffer (in both processes) to stay within it.
    w = ProcessCaptureWriter(
        tmp_path, settings(), WriterOptions(pool_granularity=granule, max_bytes_in_flight=16 * granule), device="cpu"
    )
    child = w.child_pid
    try:
        for i in range(3):
            submit_whole(w, f"hsx-ab12cd34-{i}", 8, seed=i)  # 8 rows x 128 B + ids + lens: one 2 KiB class
            assert w.flush(timeout=60)
        assert w.pool.allocations == 1 and w.buffers.count == 1, "one buffer, reused by every batch"
        assert memfd_mappings() == maps_before + 1 and memfd_mappings(child) == 1
        submit_whole(w, "hsx-ab12cd34-9", 100, seed=9)  # 12.8 KiB of rows: a 16 KiB buffer
        assert w.flush(timeout=60)
        assert w.pool.allocations == 2 and w.pool.free_sizes == [16 * granule]
        assert memfd_mappings() == maps_before + 1, "the dropped buffer is unmapped here"
        submit_whole(w, "hsx-ab12cd34-10", 8, seed=10)  # tells the child of the drop before this batch
        assert w.flush(timeout=60)
        assert memfd_mappings(child) == 1, "and in the child"
    finally:
        w.close()
    assert w._proc.returncode == 0, "the child exits cleanly on close"
    assert memfd_mappings() == maps_before
    assert open_fds() == fds_before
    for i in (0, 1, 2, 9, 10):
        assert (tmp_path / f"hsx-ab12cd34-{i}" / DONE_FILE).exists()


def test_the_child_exits_after_writing_what_it_was_sent_when_its_parent_goes_away(tmp_path):
    """The parent's end of the socket closes without a flush (as when the server process dies):
    the child writes the batch it was sent, then exits by itself."""
    w = ProcessCaptureWriter(tmp_path, settings(), WriterOptions(pool_granularity=1024), device="cpu")
    try:
        submit_whole(w, "hsx-ab12cd34-0", 8, seed=1)
        wait_until("the batch is sent to the child", lambda: w.batches_handed_over == 1)
        w._sock.shutdown(socket.SHUT_RDWR)  # what the kernel does to the socket of a process that died
        assert w._proc.wait(timeout=60) == 0
        assert (tmp_path / "hsx-ab12cd34-0" / DONE_FILE).exists()
        assert not (tmp_path / "hsx-ab12cd34-0" / FAILED_FILE).exists()
    finally:
        w.close()


def test_a_writer_process_dead_before_its_first_batch_leaves_every_request_written_in_process(tmp_path):
    w = ProcessCaptureWriter(tmp_path, settings(), WriterOptions(pool_granularity=1024), device="cpu")
    try:
        os.kill(w.child_pid, signal.SIGKILL)
        wait_until("the parent writes in-process", lambda: w.writing_in_process)
        aux, final, ids = submit_whole(w, "hsx-ab12cd34-0", 8, seed=1)
        assert w.flush(timeout=60)
    finally:
        w.close()
    st = read_states(tmp_path / "hsx-ab12cd34-0")
    assert torch.equal(st.hidden, expected(aux, final)) and torch.equal(st.input_ids, ids)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_shared_buffers_are_registered_and_the_rows_land_exactly(tmp_path):
    """The GPU path: memfd buffers registered with CUDA (so the copy is asynchronous), unregistered
    and unmapped when the pool lets them go."""
    w = ProcessCaptureWriter(tmp_path, settings(), WriterOptions(pool_granularity=1024), device="cuda")
    try:
        aux, final, ids = rows(40, seed=3)
        w.submit([BatchRequest("hsx-ab12cd34-0", 0, 0, 40, 0)], aux.cuda(), final.cuda(), ids.cuda(), [40])
        assert w.flush(timeout=60)
        [buf] = [torch.frombuffer(m, dtype=torch.uint8) for m in w.buffers._maps.values()]
        assert buf.is_pinned(), "the shared buffer is registered with CUDA"
        del buf
    finally:
        w.close()
    st = read_states(tmp_path / "hsx-ab12cd34-0")
    assert torch.equal(st.hidden, expected(aux, final)) and torch.equal(st.input_ids, ids)
    assert memfd_mappings() == 0
