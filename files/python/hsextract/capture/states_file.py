"""A request's ``states.safetensors`` as the capture's writer threads write it into the staging
directory: where a dump's files are, how its file is created and its rows written (a whole
request in one call; a long one's slices through a shared mapping or with pwrite,
`hsextract.capture.file_io`), and the /dev/shm space reserved for mapped writes.

A dump's paths are said here once, as plain strings (pathlib costs on the per-request path: short
prompts are hundreds of requests a second). The rids that reach the writer are plain names (the
planner takes no other, `hsextract.capture.core`); `discard`, which deletes, checks again.

Whenever a request's file is created, a directory it finds already there lost its markers first:
a ``done.json`` or ``failed.json`` there is an earlier send's, and the drain or the client must
not read it as this send's.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from hsextract.capture.file_io import MappedFile, pwrite_all
from hsextract.staging import fs as staging_fs
from hsextract.staging.dumps import DONE_FILE, FAILED_FILE, STATES_FILE, StateFileLayout

if TYPE_CHECKING:  # annotations only: torch stays out of what imports this (the wire, through outcomes)
    from hsextract.capture.host_stage import StagedBatch
    from hsextract.capture.slices import SliceTask

log = logging.getLogger("hsextract.capture")


class StatesFileWriter:
    """Creates and writes requests' files under one staging directory; reserves space for mapped
    writes. Thread-safe: the writer threads share one."""

    def __init__(self, dump_dir: str | Path, map_margin_bytes: int):
        self.root = os.fspath(dump_dir)
        self.map_margin_bytes = int(map_margin_bytes)
        self._space_lock = threading.Lock()
        self._reserved = 0  # bytes promised to mappings and not yet written

    # ---- paths ------------------------------------------------------------------------------------
    def path(self, rid: str, name: str = STATES_FILE) -> str:
        """The path of file ``name`` (the states file by default) of request ``rid``'s dump."""
        return f"{self.root}/{rid}/{name}"

    def is_complete(self, rid: str) -> bool:
        """Is a complete dump of ``rid`` still staged (its ``done.json`` there)?"""
        return os.path.exists(self.path(rid, DONE_FILE))

    # ---- creating and writing ---------------------------------------------------------------------
    def create(self, rid: str, layout: StateFileLayout) -> None:
        """(Re)create the request's file at full size with its header, for its slices to fill."""
        fd = staging_fs.create_file(f"{self._open_dir(rid)}/{STATES_FILE}")
        try:
            os.ftruncate(fd, layout.file_size)
            pwrite_all(fd, memoryview(layout.header), 0)
        finally:
            os.close(fd)

    def create_whole(
        self, rid: str, layout: StateFileLayout, rows: memoryview, ids: memoryview, scales: memoryview | None = None
    ) -> None:
        """Create a request's file and write all of it (header, rows, ids, an FP8 file's scales:
        contiguous) in one call."""
        fd = staging_fs.create_file(f"{self._open_dir(rid)}/{STATES_FILE}")
        try:
            parts = [memoryview(layout.header), rows, ids, *([scales] if scales is not None else [])]
            written = os.pwritev(fd, parts, 0)
            if written < layout.file_size:  # a short write: the rest, piece by piece
                flat = b"".join(parts)
                pwrite_all(fd, memoryview(flat)[written:], written)
        finally:
            os.close(fd)

    def write(self, task: SliceTask, job: StagedBatch, mv: memoryview) -> int:
        """Write a task's rows of the batch in host buffer ``mv`` (and its segment's ids and FP8 scales,
        with its first slice) into the request's file; the bytes written. Raises OSError."""
        seg = task.seg
        layout = seg.state.layout
        rows = task.rows_in(job, mv)
        ids = task.ids_in(job, mv) if task.with_ids else None
        scales = task.scales_in(job, mv) if task.with_ids and job.scale_bytes else None
        if task.whole:
            assert ids is not None  # a whole request's one slice is its first
            self.create_whole(seg.state.rid, layout, rows, ids, scales)
        else:
            dst = layout.hidden_offset(task.dst_row)
            if task.mapped is not None:  # parallel: page faults do not take the inode lock
                ctypes.memmove(
                    task.mapped.addr + dst, job.buf.data_ptr() + task.first_batch_row * job.row_bytes, len(rows)
                )
            pieces = [] if task.mapped is not None else [(rows, dst)]
            if ids is not None:
                pieces.append((ids, layout.ids_offset(seg.dst_row)))
            if scales is not None:
                pieces.append((scales, layout.scales_offset(seg.dst_row)))
            if pieces:
                self._pwrite(seg.state.rid, pieces)
        return len(rows) + (len(ids) if ids is not None else 0) + (len(scales) if scales is not None else 0)

    def _pwrite(self, rid: str, pieces: list[tuple[memoryview, int]]) -> None:
        """Write each ``(data, file offset)`` into the request's existing file (tmpfs serialises
        these per file: a `MappedFile` is the parallel way)."""
        fd = staging_fs.open_file(self.path(rid), os.O_WRONLY)
        try:
            for data, offset in pieces:
                pwrite_all(fd, data, offset)
        finally:
            os.close(fd)

    def discard(self, rid: str) -> None:
        """Remove a failed request's partial file to give the space back; nothing in a directory
        the capture did not make, and never an error."""
        try:
            d = f"{self.root}/{staging_fs.plain_name(rid)}"
            staging_fs.check_own_dir(d)
            os.unlink(f"{d}/{STATES_FILE}")
        except OSError:
            pass

    def _open_dir(self, rid: str) -> str:
        """The request's directory, made if new; the markers an earlier send of the same rid left
        in it removed."""
        d, new = staging_fs.make_dir(self.root, rid)
        if not new:
            for stale in (DONE_FILE, FAILED_FILE):
                try:
                    os.unlink(f"{d}/{stale}")
                    log.info("rid %s: removed a stale %s left by an earlier send", rid, stale)
                except FileNotFoundError:
                    pass
        return d

    # ---- mapped writes ----------------------------------------------------------------------------
    def map(self, rid: str, layout: StateFileLayout, users: int, nbytes: int) -> MappedFile | None:
        """A shared mapping of the request's file for ``users`` slices of ``nbytes`` in all, if
        /dev/shm has room to spare for them; else None (the slices use pwrite). A page fault on a
        full tmpfs is a SIGBUS (fatal), not an error, whereas pwrite reports ENOSPC as one."""
        if not self._reserve(nbytes):
            return None
        path = self.path(rid)
        try:
            return MappedFile(Path(path), layout.file_size, users, nbytes, self._unreserve)
        except (OSError, ValueError) as exc:
            self._unreserve(nbytes)
            log.warning("capture: cannot map %s (%s); writing it with pwrite", path, exc)
            return None

    def _reserve(self, nbytes: int) -> bool:
        try:
            st = os.statvfs(self.root)
        except OSError:
            return False
        free = st.f_bavail * st.f_frsize
        with self._space_lock:
            if free - self._reserved - nbytes < self.map_margin_bytes:
                return False
            self._reserved += nbytes
        return True

    def _unreserve(self, nbytes: int) -> None:
        with self._space_lock:
            self._reserved -= nbytes
