"""What the forward pass hands its batches to: the `CaptureSink` interface, the options every
writer takes, and the forward-side queue both writers share.

Two sinks implement it: `hsextract.capture.writer.CaptureWriter` writes from threads of the
scheduler's process, `hsextract.capture.writer_process.ProcessCaptureWriter` from a child
process. The forward pass does the same in both (`BatchQueue.submit_owned`: stage the batch into a
host buffer, queue it) and never waits on file I/O; a dispatcher thread takes the queued items
one at a time.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from hsextract.capture.core import BatchRequest, CaptureSettings
from hsextract.capture.host_stage import Failures, HostStager, OwnedBatch, StagedBatch, failures_of, own_batch

_MiB = 1 << 20


@dataclass(frozen=True)
class WriterOptions:
    """How a writer writes (the capture patch's ``writer_threads``, ``max_bytes_in_flight`` and
    tunables), sent whole to the writer process."""

    num_threads: int = 8
    max_bytes_in_flight: int = 2 << 30  # host buffers of batches not yet written
    slice_bytes: int = 32 * _MiB  # a long request is written by several threads, in slices of this size
    map_margin_bytes: int = 512 * _MiB  # mapped (parallel) writes only with this much /dev/shm to spare
    pool_granularity: int = 2 * _MiB  # host buffers come in this size times a power of two
    verify_rows: bool = True  # recompute every row's fingerprint from the host copy before it is written


class CaptureSink(Protocol):
    """Where the capture hook sends each prefill batch."""

    def submit_owned(self, batch: OwnedBatch, tokens: torch.Tensor | None = None) -> None:
        """Stage a batch taken at hook time (with its greedy tokens, if known) for writing."""

    def submit(
        self,
        requests: list[BatchRequest],
        aux: torch.Tensor | Sequence[torch.Tensor],
        final: torch.Tensor,
        input_ids: torch.Tensor,
        prompt_lens: torch.Tensor | Sequence[int],
        tokens: torch.Tensor | None = None,
    ) -> None:
        """`own_batch` and `submit_owned` in one call."""

    def fail_requests(self, requests: list[BatchRequest], reason: str, detail: str) -> None:
        """Mark requests the forward pass could not hand over as failed, in order with the batches."""

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted so far is written or failed; False on timeout."""

    def close(self, timeout: float | None = 60) -> None:
        """Flush and stop."""


class BatchQueue:
    """What both writers do on the forward pass's side: stage a batch, count it outstanding and
    queue it, or queue its requests' failures, for a dispatcher thread that takes the items one at
    a time (`_dispatch_one`). ``_cond`` guards ``_outstanding``."""

    settings: CaptureSettings
    _stager: HostStager
    _jobs: queue.Queue
    _cond: threading.Condition
    _outstanding: int

    def submit_owned(self, batch: OwnedBatch, tokens: torch.Tensor | None = None) -> None:
        self._enqueue(self._stager.stage(batch, tokens))

    def submit(
        self,
        requests: list[BatchRequest],
        aux: torch.Tensor | Sequence[torch.Tensor],
        final: torch.Tensor,
        input_ids: torch.Tensor,
        prompt_lens: torch.Tensor | Sequence[int],
        tokens: torch.Tensor | None = None,
    ) -> None:
        if requests:
            self.submit_owned(own_batch(self.settings, requests, aux, final, input_ids, prompt_lens), tokens)

    def fail_requests(self, requests: list[BatchRequest], reason: str, detail: str) -> None:
        if requests:
            self._enqueue(Failures(failures_of(requests, reason, detail)))

    def _enqueue(self, item: StagedBatch | Failures) -> None:
        with self._cond:
            self._outstanding += 1
        self._jobs.put(item)

    def _dispatch_loop(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            self._dispatch_one(item)
            del item  # not held while waiting for the next: its buffer may be unmapped once released

    def _dispatch_one(self, item) -> None:
        raise NotImplementedError
