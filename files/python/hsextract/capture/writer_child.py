"""The capture's writer process itself: the child that `ProcessCaptureWriter`
(hsextract.capture.writer_process) starts beside SGLang's scheduler, and what it runs.

It maps the host buffers the parent sends it (memfd descriptors over the unix socket pair), writes
each batch that landed in them with the ordinary `CaptureWriter` (on the CPU, no pool of its own),
tells the parent when a buffer is free again, and answers flushes with its counters. On the
parent's EOF (the parent closed, or died) it writes what it was sent and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import torch

from hsextract.capture import wire
from hsextract.capture.core import CaptureSettings
from hsextract.capture.host_stage import StagedBatch
from hsextract.capture.sink import WriterOptions
from hsextract.capture.wire import MessageReader, send_message
from hsextract.capture.writer import CaptureWriter

log = logging.getLogger("hsextract.capture")

#: The module the child runs as (``python -m``): what its command line names, and how a test or a
#: bench finds the writer processes among a server's.
CHILD_MODULE = "hsextract.capture.writer_child"


def spawn_child(child_sock: socket.socket) -> subprocess.Popen:
    """Start the child on the parent's interpreter, with this hsextract package importable."""
    import hsextract

    root = str(Path(hsextract.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["CUDA_VISIBLE_DEVICES"] = ""  # the child writes files; it never touches the GPU
    fd = child_sock.fileno()
    return subprocess.Popen(
        [sys.executable, "-m", CHILD_MODULE, "--fd", str(fd)],
        pass_fds=(fd,),
        env=env,
        stdin=subprocess.DEVNULL,
    )


def landed_batch_writer(dump_dir: str | Path, settings: CaptureSettings, options: WriterOptions) -> CaptureWriter:
    """The writer of batches that have landed already (the child's, and the parent's after the
    child died): on the CPU, with no pool of its own."""
    return CaptureWriter(
        dump_dir, settings, WriterOptions(**{**options.__dict__, "max_bytes_in_flight": 0}), device="cpu"
    )


class _Child:
    """The child's state: the parent's buffers mapped here, and the writer that writes from them."""

    def __init__(self, sock: socket.socket, reader: MessageReader, writer: CaptureWriter):
        self.sock, self.reader, self.writer = sock, reader, writer
        self.buffers: dict[int, torch.Tensor] = {}
        self._send_lock = threading.Lock()

    def send(self, message: object) -> None:
        with self._send_lock, contextlib.suppress(OSError):  # the parent is gone: the loop sees EOF and ends
            send_message(self.sock, message)

    def handle(self, msg: object) -> None:
        match msg:
            case wire.Batch(buffer_id=bid):
                self.writer.submit_landed(
                    StagedBatch(
                        msg.batch_requests(),
                        self.buffers[bid],
                        msg.rows,
                        msg.row_bytes,
                        msg.meta_offset,
                        msg.batch_size,
                        on_finish=lambda job: self.send(wire.Released(bid)),
                        scale_bytes=msg.scale_bytes,
                    )
                )
            case wire.NewBuffer(buffer_id=bid, nbytes=nbytes):
                fd = self.reader.take_fd()
                try:
                    mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                finally:
                    os.close(fd)
                self.buffers[bid] = torch.frombuffer(mm, dtype=torch.uint8)
            case wire.DropBuffer(buffer_id=bid):
                self.buffers.pop(bid, None)
            case wire.Fail():
                self.writer.queue_failures(msg.as_failures())
            case wire.Flush(token=token):
                self.writer.flush()
                self.send(wire.Flushed(token, self.writer.counters))
            case _:
                log.error("capture writer process: unknown message %r; ignored", type(msg).__name__)


def serve(sock: socket.socket) -> int:
    """The child's loop: map the buffers it is sent, write the batches, answer flushes; on the
    parent's EOF write what it was sent and return."""
    reader = MessageReader(sock)
    first = reader.read()
    if not isinstance(first, wire.Init):
        log.error("capture writer process: no init message from the parent (got %r); exiting", first)
        return 2
    writer = landed_batch_writer(first.dump_dir, first.settings, first.options)
    child = _Child(sock, reader, writer)
    try:
        while (msg := reader.read()) is not None:
            child.handle(msg)
    finally:
        writer.close(timeout=None)
        reader.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the capture's writer process (started by the capture, not by hand)")
    ap.add_argument("--fd", type=int, required=True, help="the unix socket shared with the parent")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the server: exit on the parent's EOF, flushed
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="[%(asctime)s] hsextract capture writer process[%(process)d] %(levelname)s %(message)s",
    )
    sock = socket.socket(fileno=args.fd)
    try:
        return serve(sock)
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
