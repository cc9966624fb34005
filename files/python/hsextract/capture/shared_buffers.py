"""The host buffers of the writer-process mode: memfd mappings shared by the scheduler's process
and its writer process, registered with CUDA so that the device-to-host copy stays asynchronous.

The rows never cross the process boundary: a buffer's descriptor goes to the child once (with a
buffer id), and memfd memory is freed with the last mapping, so nothing is left in /dev/shm if
either process dies.
"""

from __future__ import annotations

import logging
import mmap
import os
import socket
import threading

import torch

from hsextract.capture import wire
from hsextract.capture.wire import send_message

log = logging.getLogger("hsextract.capture")

MEMFD_NAME = "hsx-capture-buffer"  # as it shows in /proc/<pid>/maps


def _cuda_register(ptr: int, nbytes: int) -> None:
    err = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister of a {nbytes} B shared host buffer failed (error {int(err)})")


def _cuda_unregister(ptr: int) -> None:
    err = torch.cuda.cudart().cudaHostUnregister(ptr)
    if int(err) != 0:
        log.warning("capture: cudaHostUnregister of a shared host buffer failed (error %d)", int(err))


class SharedHostBuffers:
    """The allocator of the pool's buffers in writer-process mode: memfd mappings the child maps too.

    A new buffer's descriptor is kept until the dispatcher has sent it to the child (then closed:
    the mappings hold the memory); a buffer the pool lets go of is unregistered and unmapped here
    and, once the child has it, named for the child to unmap as well.
    """

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self._lock = threading.Lock()
        self._next_id = 0
        self._ids: dict[int, int] = {}  # data_ptr -> buffer id
        self._maps: dict[int, mmap.mmap] = {}  # buffer id -> its mapping here
        self._unsent: dict[int, tuple[int, int]] = {}  # buffer id -> (fd, size), not yet sent to the child
        self._dropped: list[int] = []  # ids the child maps and must unmap
        self._child_gone = False

    def allocate(self, nbytes: int) -> torch.Tensor:
        fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
            mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            buf = torch.frombuffer(mm, dtype=torch.uint8)
            if self.cuda:
                _cuda_register(buf.data_ptr(), nbytes)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            bid = self._next_id
            self._next_id += 1
            self._ids[buf.data_ptr()] = bid
            self._maps[bid] = mm
            if not self._child_gone:
                self._unsent[bid] = (fd, nbytes)
                fd = -1
        if fd >= 0:
            os.close(fd)
        return buf

    def drop(self, buf: torch.Tensor) -> None:
        """The pool lets go of ``buf``: it is unmapped once the pool's last reference goes."""
        ptr = buf.data_ptr()
        if self.cuda:
            _cuda_unregister(ptr)
        with self._lock:
            bid = self._ids.pop(ptr)
            self._maps.pop(bid, None)
            unsent = self._unsent.pop(bid, None)
            if unsent is None and not self._child_gone:
                self._dropped.append(bid)
        if unsent is not None:
            os.close(unsent[0])

    def buffer_id(self, buf: torch.Tensor) -> int:
        with self._lock:
            return self._ids[buf.data_ptr()]

    def take_news(self) -> tuple[list[tuple[int, int, int]], list[int]]:
        """(new buffers as (id, fd, size), dropped ids) not yet told to the child; the caller
        closes the descriptors once sent."""
        with self._lock:
            new = [(bid, fd, n) for bid, (fd, n) in self._unsent.items()]
            self._unsent.clear()
            dropped, self._dropped = self._dropped, []
        return new, dropped

    def tell_child(self, sock: socket.socket, message: object) -> bool:
        """Send the child what it must know first (new and dropped buffers), then ``message``;
        False once the child is gone. Called by the parent's dispatcher thread alone."""
        new, dropped = self.take_news()
        try:
            while new:
                bid, fd, n = new[0]
                try:
                    send_message(sock, wire.NewBuffer(bid, n), fd)
                finally:
                    new.pop(0)
                    os.close(fd)  # the mappings hold the memory; the child has its own descriptor
            for bid in dropped:
                send_message(sock, wire.DropBuffer(bid))
            send_message(sock, message)
            return True
        except OSError as exc:
            log.debug("capture: sending to the writer process failed: %s", exc)
            return False
        finally:
            for _bid, fd, _n in new:  # not sent: the child is gone
                os.close(fd)

    def close(self) -> None:
        """The child is gone: close the descriptors never sent, and keep none from now on."""
        with self._lock:
            self._child_gone = True
        new, _ = self.take_news()
        for _bid, fd, _n in new:
            os.close(fd)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._maps)
