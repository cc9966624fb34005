"""The forward pass's part of the capture: a batch's rows taken at hook time and copied to the host.

Two steps, both inside SGLang's forward pass, both on its current (forward) stream:

1. `own_batch`, in the decoder's hook: every tensor the capture will read later is made here, on
   the forward stream, as a new tensor: the rows concatenated into one ``[T, K + 1, H]`` block,
   the token ids and prompt lengths copied, and each row's fingerprint value
   (`hsextract.fingerprint`). Nothing kept past the hook shares storage with a tensor SGLang
   passed in. This matters: SGLang 0.5.23 runs prefill from static input buffers (its eager
   runner copies each batch's ``input_ids`` into a fixed buffer, shared with the decode graphs)
   and writes the next batch into them on the forward stream as soon as this forward is done. A
   copy queued on another stream, reading SGLang's buffer, can run after that write and stage
   another batch's ids under this batch's requests; a tensor of the capture's own, made in stream
   order before the hook returns, cannot change. (``record_stream`` only keeps the allocator from
   reusing memory; it does not stop SGLang from writing into a buffer it owns.)
2. `HostStager.stage`, once the greedy tokens are known (the logits processor's hook): one
   asynchronous copy of the block and one of the int64 metadata into a reusable pinned host buffer,
   on a side stream that first waits for the forward stream, followed by an event.

The metadata is one int64 array: ids ``[T]``, prompt lengths ``[B]``, row fingerprint values
``[T]``, greedy tokens ``[B]`` (-1 where unknown). On a CPU-only server the copies are synchronous.

With the capture's ``precision: fp8``, `own_batch` quantizes the block on its device
(`hsextract.fp8.quantize`): the block is float8_e4m3fn, half the bytes of bf16, with one float32
scale per token, and a row's fingerprint value is of its FP8 bytes followed by its scale's
(`hsextract.fp8.stored_row_values`, the drain's definition of a stored FP8 row). The host buffer
then holds the rows, their scales, and the metadata.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from hsextract import fingerprint, fp8
from hsextract.capture.core import BatchRequest, CaptureSettings, Failure
from hsextract.staging.dumps import DTYPES

log = logging.getLogger("hsextract.capture")

_ALIGN = 64
_MiB = 1 << 20
UNKNOWN_TOKEN = -1
_QUANTIZE_PIECE = 64 * _MiB  # float32 bytes of rows quantized at once on the device (precision fp8)


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class HostBufferPool:
    """Reusable host buffers (pinned when CUDA is used) under a byte budget.

    Pinned allocations are slow (cudaHostAlloc pins every page: tens of milliseconds for a
    batch of short prompts at 8B width, inside the forward pass), so buffers are kept and reused.
    Their sizes are powers of two times the granularity: batches of many sizes (short prompts
    batched 1 to 50 at a time) then share a few size classes and reuse each other's buffers,
    instead of each new size costing a new pinned allocation. The budget bounds the bytes held
    by the pool, in use or free; a request larger than the whole budget is still served when
    nothing else is in use, so an oversized batch cannot deadlock the capture.

    ``allocate(nbytes)`` makes a new buffer (default: ``torch.empty``, pinned when ``pin``) and
    ``drop(buf)`` is told of each buffer the pool lets go of, so that buffers of another kind
    (memory shared with the writer process) can be given back where they came from.
    """

    def __init__(
        self,
        max_bytes: int,
        pin: bool,
        granularity: int = 2 * _MiB,
        allocate: Callable[[int], torch.Tensor] | None = None,
        drop: Callable[[torch.Tensor], None] | None = None,
    ):
        self.max_bytes = int(max_bytes)
        self.pin = pin
        self.granularity = max(1, int(granularity))
        self._allocate = allocate or (lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=self.pin))
        self._drop = drop
        self._cond = threading.Condition()
        self._free: list[torch.Tensor] = []
        self._in_use = 0
        self._held = 0  # bytes allocated (in use + free)
        self.blocked_seconds = 0.0
        self.blocked_count = 0
        self._last_block_log = 0.0
        self.allocations = 0
        self.allocation_seconds = 0.0

    @property
    def in_use(self) -> int:
        return self._in_use

    def acquire(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of at least ``nbytes``; blocks while the budget is spent."""
        t0 = None
        with self._cond:
            while True:
                buf = self._take(nbytes)
                if buf is not None:
                    break
                if t0 is None:
                    t0 = time.monotonic()
                    self.blocked_count += 1
                    if t0 - self._last_block_log > 10:
                        self._last_block_log = t0
                        log.warning(
                            "capture blocked: %d MiB of host buffers in flight reached the limit of %d MiB; "
                            "the forward pass waits for the writers (raise the in-flight limit or add writer "
                            "threads if this repeats)",
                            self._in_use // _MiB,
                            self.max_bytes // _MiB,
                        )
                self._cond.wait(timeout=1.0)
        if t0 is not None:
            self.blocked_seconds += time.monotonic() - t0
        return buf

    def try_acquire(self, nbytes: int) -> torch.Tensor | None:
        """`acquire` without waiting: None where it would block."""
        with self._cond:
            return self._take(nbytes)

    def _take(self, nbytes: int) -> torch.Tensor | None:
        """The smallest free buffer that fits, else a new one within the budget, else None (under the lock).

        Free buffers are found by index, never by value: ``list.remove`` would compare tensors
        with ``==`` (element-wise), which raises once the pool holds buffers of different sizes.
        """
        best = None
        for i, b in enumerate(self._free):
            if b.numel() >= nbytes and (best is None or b.numel() < self._free[best].numel()):
                best = i
        if best is not None:
            buf = self._free.pop(best)
            self._in_use += buf.numel()
            return buf
        need = self.size_class(nbytes)
        while self._free and self._held + need > self.max_bytes:
            largest = max(range(len(self._free)), key=lambda i: self._free[i].numel())
            self._let_go(self._free.pop(largest))
        if self._held + need > self.max_bytes and self._in_use != 0:
            return None
        # Within the budget, or an oversized request while nothing else is in use (it goes alone,
        # so an oversized batch cannot deadlock the capture).
        t0 = time.monotonic()
        buf = self._allocate(need)
        took = time.monotonic() - t0
        self.allocations += 1
        self.allocation_seconds += took
        self._held += need
        self._in_use += need
        if took > 0.01:
            log.info(
                "capture: a new %d MiB host buffer took %.0f ms (pool: %d MiB in %d buffers, %d allocations)",
                need // _MiB,
                took * 1000,
                self._held // _MiB,
                len(self._free) + 1,
                self.allocations,
            )
        return buf

    def size_class(self, nbytes: int) -> int:
        """The size of a new buffer for ``nbytes``: the granularity times a power of two."""
        units = -(-max(int(nbytes), 1) // self.granularity)
        return self.granularity * (1 << (units - 1).bit_length())

    @property
    def held(self) -> int:
        """Bytes the pool holds, in use or free."""
        return self._held

    @property
    def free_sizes(self) -> list[int]:
        with self._cond:
            return [b.numel() for b in self._free]

    def release(self, buf: torch.Tensor) -> None:
        with self._cond:
            self._in_use -= buf.numel()
            self._free.append(buf)
            self._cond.notify_all()

    def clear(self) -> None:
        """Let go of every free buffer (buffers in use stay the caller's)."""
        with self._cond:
            while self._free:
                self._let_go(self._free.pop())

    def _let_go(self, buf: torch.Tensor) -> None:
        """A free buffer leaves the pool (under the lock)."""
        self._held -= buf.numel()
        if self._drop is not None:
            try:
                self._drop(buf)
            except Exception:  # a failed unmap must not fail the forward pass
                log.exception("capture: letting go of a %d MiB host buffer failed", buf.numel() // _MiB)


@dataclass
class OwnedBatch:
    """A batch as the capture keeps it past the decoder's hook: tensors made on the forward
    stream at hook time, sharing no storage with anything SGLang passed in (see the module
    docstring)."""

    requests: list[BatchRequest]
    block: torch.Tensor  # [T, K + 1, H] in the staging dtype (float8_e4m3fn with precision fp8)
    ids: torch.Tensor  # int64 [T]
    prompt_lens: torch.Tensor  # int64 [B]
    row_values: torch.Tensor  # int64 [T]: hsextract.fingerprint.row_values(block, ids), or fp8.stored_row_values
    scales: torch.Tensor | None = None  # float32 [T]: each token's FP8 scale (precision fp8), else None

    @property
    def rows(self) -> int:
        return int(self.block.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.prompt_lens.numel())


def own_batch(
    settings: CaptureSettings,
    requests: list[BatchRequest],
    aux: torch.Tensor | Sequence[torch.Tensor],
    final: torch.Tensor,
    input_ids: torch.Tensor,
    prompt_lens: torch.Tensor | Sequence[int],
) -> OwnedBatch:
    """The batch's rows (``aux`` packed ``[T, K*H]`` or K tensors ``[T, H]``; ``final`` ``[T, H]``),
    ids and prompt lengths, as new tensors of the capture's own (always copies: `torch.cat`,
    `torch.stack` and ``clone`` allocate); with precision fp8, the block quantized on its device."""
    k, h = settings.num_aux, settings.hidden_size
    rows = max(r.batch_row + r.extend_len for r in requests)
    dtype = DTYPES[settings.dtype][0]
    with torch.no_grad():
        if torch.is_tensor(aux):
            if aux.shape[-1] != k * h:
                raise ValueError(f"aux hidden states have width {aux.shape[-1]}, expected {k} x {h}")
            block = torch.cat([aux[:rows].reshape(rows, k, h), final[:rows].reshape(rows, 1, h)], dim=1)
        else:
            if len(aux) != k:
                raise ValueError(f"got {len(aux)} aux hidden states, expected {k}")
            block = torch.stack([a[:rows] for a in aux] + [final[:rows]], dim=1)
        if block.dtype != dtype:
            block = block.to(dtype)
        ids = input_ids[:rows].to(torch.int64, copy=True)
        if torch.is_tensor(prompt_lens):
            lens = prompt_lens.to(torch.int64, copy=True)
        else:
            lens = torch.tensor(list(prompt_lens), dtype=torch.int64, device=block.device)
        block, scales, values = _as_staged(settings, block, ids)
    return OwnedBatch(list(requests), block, ids, lens, values, scales)


def _as_staged(settings: CaptureSettings, block: torch.Tensor, ids: torch.Tensor) -> tuple:
    """(rows as staged, their scales or None, each row's fingerprint value): the block as computed, or
    with precision fp8 quantized on its own device (its float32 scales ``[T]``), each row's value then
    of its FP8 bytes and its scale's, as the drain takes them of a stored FP8 row."""
    if settings.precision != "fp8":
        return block, None, fingerprint.row_values(block, ids)
    rows = block.shape[0]
    q = torch.empty(block.shape, dtype=fp8.DTYPE, device=block.device)
    scales = torch.empty(rows, dtype=torch.float32, device=block.device)
    # A piece of rows at a time: quantize's float32 temporaries are twice the block's bf16 bytes, and a
    # token's scale depends on its own rows only, so the pieces give what the whole would.
    step = max(1, _QUANTIZE_PIECE // max(1, 4 * block.shape[1] * block.shape[2]))
    for a in range(0, rows, step):
        q[a : a + step], piece_scales = fp8.quantize(block[a : a + step])
        scales[a : a + step] = piece_scales.reshape(-1)
    return q, scales, fp8.stored_row_values(q, scales, ids)


def greedy_tokens(next_token_logits: torch.Tensor | None, batch_size: int) -> torch.Tensor | None:
    """The token SGLang's greedy sampler picks for each request of the batch (int64 ``[B]``, on
    the logits' device, a new tensor), or None where the logits do not hold one row per request."""
    if next_token_logits is None or next_token_logits.dim() != 2 or next_token_logits.shape[0] != batch_size:
        return None
    with torch.no_grad():
        return torch.argmax(next_token_logits, dim=-1).to(torch.int64)


@dataclass
class StagedBatch:
    """One batch in a host buffer: its rows, its FP8 scales (``scale_bytes`` a row: 4 with precision
    fp8, else 0 and none), then its int64 metadata (see the module docstring).

    ``event`` says when the asynchronous copy has landed (None: it has). ``on_finish`` is called
    once the batch is written, in place of giving ``buf`` back to the writer's pool (a batch
    handed over already landed, in a buffer that belongs to someone else)."""

    requests: list[BatchRequest]
    buf: torch.Tensor
    rows: int
    row_bytes: int
    meta_offset: int  # byte offset of the int64 metadata in buf
    batch_size: int
    event: object | None = None
    remaining: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    on_finish: Callable[[StagedBatch], None] | None = None
    scale_bytes: int = 0

    @staticmethod
    def layout(rows: int, row_bytes: int, batch_size: int, scale_bytes: int = 0) -> tuple[int, int]:
        """(meta offset, total bytes) of a batch of this shape in a host buffer."""
        meta = _round_up(_round_up(rows * row_bytes, _ALIGN) + rows * scale_bytes, _ALIGN)
        return meta, meta + 8 * (2 * rows + 2 * batch_size)

    @property
    def scales_offset(self) -> int:
        """Byte offset in ``buf`` of the first row's scale (where `scale_bytes` is not 0)."""
        return _round_up(self.rows * self.row_bytes, _ALIGN)

    @property
    def scales(self) -> torch.Tensor:
        """float32 ``[T]``: each row's FP8 scale (precision fp8 only)."""
        return self.buf[self.scales_offset : self.scales_offset + 4 * self.rows].view(torch.float32)

    def _meta(self, start: int, n: int) -> torch.Tensor:
        off = self.meta_offset + 8 * start
        return self.buf[off : off + 8 * n].view(torch.int64)

    @property
    def ids(self) -> torch.Tensor:
        return self._meta(0, self.rows)

    @property
    def prompt_lens(self) -> torch.Tensor:
        return self._meta(self.rows, self.batch_size)

    @property
    def row_values(self) -> torch.Tensor:
        return self._meta(self.rows + self.batch_size, self.rows)

    @property
    def greedy_tokens(self) -> torch.Tensor:
        return self._meta(2 * self.rows + self.batch_size, self.batch_size)

    def ids_offset(self, batch_row: int) -> int:
        """Byte offset in ``buf`` of the id of ``batch_row``."""
        return self.meta_offset + 8 * batch_row


@dataclass
class Failures:
    """Requests to fail (the forward pass could not hand them over, or the writer process died
    before it wrote them): the writer fails them in order with the batches before and after them
    (so that a later chunk of one finds it failed)."""

    failures: list[Failure]


def failures_of(requests: Sequence[BatchRequest], reason: str, detail: str) -> list[Failure]:
    """The same failure for each request."""
    return [Failure(r.rid, reason, detail) for r in requests]


class HostStager:
    """Copies owned batches into host buffers; the one thing the forward pass pays for besides
    `own_batch`. Shared by the in-process writer and the writer process's parent side, so that
    the forward pass pays the same in both modes."""

    def __init__(self, settings: CaptureSettings, device: torch.device, pool: HostBufferPool):
        self.settings = settings
        self.device = device
        self.cuda = device.type == "cuda"
        self.pool = pool
        self._side_stream = torch.cuda.Stream(device=device) if self.cuda else None

    def stage(self, batch: OwnedBatch, tokens: torch.Tensor | None = None) -> StagedBatch:
        """Queue the copy of ``batch`` (and its greedy tokens, int64 ``[B]``) into a pool buffer."""
        rows, bsz = batch.rows, batch.batch_size
        if tokens is None:
            tokens = torch.full((bsz,), UNKNOWN_TOKEN, dtype=torch.int64, device=batch.ids.device)
        with torch.no_grad():
            meta = torch.cat([batch.ids, batch.prompt_lens, batch.row_values, tokens.to(torch.int64)])
        row_bytes = batch.block[0].numel() * batch.block.element_size() if rows else 0
        scale_bytes = 0 if batch.scales is None else 4
        meta_off, total = StagedBatch.layout(rows, row_bytes, bsz, scale_bytes)
        buf = self.pool.acquire(total)
        staged = StagedBatch(batch.requests, buf, rows, row_bytes, meta_off, bsz, scale_bytes=scale_bytes)
        try:
            copies = [(buf[: rows * row_bytes].view(batch.block.dtype).view(batch.block.shape), batch.block)]
            if batch.scales is not None:
                copies.append((staged.scales, batch.scales))
            copies.append((buf[meta_off : meta_off + 8 * meta.numel()].view(torch.int64), meta))
            staged.event = self._copy_to_host(copies)
        except BaseException:
            self.pool.release(buf)
            raise
        return staged

    def _copy_to_host(self, copies: list[tuple[torch.Tensor, torch.Tensor]]) -> object | None:
        """Copy each (host view of the buffer, the capture's tensor), asynchronously on the side
        stream on CUDA; the event that says they landed, or None when the copies were synchronous."""
        if not self.cuda:
            for host, t in copies:
                host.copy_(t)
            return None
        stream = self._side_stream
        assert stream is not None  # made with the stager on CUDA
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for host, t in copies:
                host.copy_(t, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        for _, t in copies:  # the capture's own tensors: kept from the allocator until copied
            if t.device.type == "cuda":
                t.record_stream(stream)
        return event
