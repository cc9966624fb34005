"""What every format writer gets and provides.

A writer is pure: it turns a validated `Sample` into a `Payload` (the bytes of one file, produced
into a sink) and names the file for an output index. Durability, numbering and the manifest
belong to the drain, not to the formats. Payloads stream into the sink, so no format builds its
whole file in memory, and staged bytes that go out unchanged stream through piece by piece (`SourceRange`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from hsextract.formats.index_width import pickled_int_bytes as _pickled_int_bytes
from hsextract.formats.stored import StoredSample
from hsextract.output.manifest import ManifestEntry, ManifestHeader
from hsextract.output.target import TokenReader


@dataclass
class SourceRange:
    """Bytes of the staged dump that go into the file unchanged (its rows, then its token ids):
    `length` bytes, as the pieces `pieces` yields in order.

    The drain reads each piece once into memory of its own and checks it (the fingerprint, finite
    values) before it yields it (hsextract.drain.staged_io); the sink hashes and writes that same
    piece while it is still in the CPU cache. So the bytes checked are the bytes written and
    hashed, and the staged file is never read a second time.
    """

    length: int
    pieces: Iterable[memoryview]


@dataclass
class Sample:
    """One validated sample: what the server ran and what the client asked for."""

    rid: str
    dataset_index: int
    input_ids: torch.Tensor  # int64 [T]
    loss_mask: torch.Tensor  # int64 [T]
    # [T, K + 1, H]: K aux layers, then the final hidden state. Where the drain streams the rows
    # (`staged`), a tensor on the meta device: their shape and dtype, no data.
    hidden: torch.Tensor
    # The staged bytes of `hidden` followed by `input_ids`, where the drain streams them.
    staged: SourceRange | None = None
    # The rows of slots [a, b) as [T, (b - a) * H] tensors of their own, keyed (a, b): the groups the
    # format names in `slot_groups`, which the drain fills as it reads the rows (`hidden` is then meta).
    slot_rows: dict[tuple[int, int], torch.Tensor] | None = None
    # FP8 rows (`hidden` of dtype float8_e4m3fn, hsextract.fp8): each token's float32 scale, [T, 1, 1],
    # as a tensor or, where the rows stream, as the bytes the drain yields once the last row went by.
    scales: torch.Tensor | SourceRange | None = None

    def slots(self, start: int, stop: int) -> torch.Tensor:
        """Slots [start, stop) of every row, as a new [T, (stop - start) * H] tensor owning its memory."""
        if self.slot_rows is not None and (start, stop) in self.slot_rows:
            return self.slot_rows[(start, stop)]
        return copy_slots(self.hidden, start, stop)

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_aux(self) -> int:
        return int(self.hidden.shape[1]) - 1


class Sink(Protocol):
    def write(self, data: Any) -> int: ...

    def flush(self) -> None: ...

    def copy_range(self, src: SourceRange) -> None: ...


class Payload(Protocol):
    def write_to(self, sink: Sink) -> None: ...


@dataclass
class ChunksPayload:
    """A file made of byte chunks and staged ranges, in order."""

    chunks: Sequence[bytes | memoryview | SourceRange]

    def write_to(self, sink: Sink) -> None:
        for c in self.chunks:
            if isinstance(c, SourceRange):
                sink.copy_range(c)
            else:
                sink.write(c)


@dataclass
class TorchSavePayload:
    """A ``torch.save`` file (default zip format, so readers can ``mmap`` it), streamed into the sink."""

    obj: Any

    def write_to(self, sink: Sink) -> None:
        # torch.save writes to any object with write() and flush() (its docs); the annotation says IO[bytes]
        torch.save(self.obj, sink)  # type: ignore[arg-type]


def torch_slot_groups(slots: int) -> list[tuple[int, int]]:
    """The groups of slots SpecForge's and ModelOpt's files store apart: the aux layers, the final state."""
    return [(0, slots - 1), (slots - 1, slots)]


def copy_slots(hidden: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Slots [start, stop) of every row of `hidden` [T, S, H], as a new [T, (stop - start) * H] tensor.

    The copy owns its memory (``torch.save`` of a view would write the whole staged storage).
    It is made by numpy into numpy's allocation: numpy asks the kernel for huge pages for large
    arrays, and torch's own copy of these strided rows into a fresh ``torch.empty`` ran at a
    third of the speed, most of it faulting in new 4 KiB pages (measured: 1.5 versus 4.8 GB/s).
    """
    import numpy as np

    t, s, h = hidden.shape
    rows = hidden.reshape(t, s * h).view(torch.uint8)  # a view: the staged rows are contiguous
    w = rows.shape[1] // s  # bytes per slot
    out = np.empty((t, (stop - start) * w), dtype=np.uint8)
    if out.size:
        np.copyto(out, rows[:, start * w : stop * w].numpy(), casting="no")
    return torch.from_numpy(out).view(hidden.dtype)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a tensor (no copy when it is contiguous), for any dtype including bf16."""
    t = t.contiguous()
    if t.numel() == 0:
        return memoryview(b"")
    return t.reshape(-1).view(torch.uint8).numpy().data


class OutputFormat(Protocol):
    name: str
    final_hidden: str  # where this format's trainer expects the final hidden state
    # Matches the file names this format writes, with the output index as group 1 (orphan scan).
    file_pattern: re.Pattern[str]
    # True when the format's reader takes every file under the output directory whose name ends
    # in "pt" as a sample (so no other file written there may end that way).
    reads_every_pt_file: bool

    def relative_path(self, output_index: int) -> str:
        """Where sample `output_index` lives, relative to the output directory."""
        ...

    def encode(self, sample: Sample) -> Payload:
        """The file's contents."""
        ...

    def finalize(
        self,
        output_dir: Path,
        header: ManifestHeader,
        entries: Sequence[ManifestEntry],
        tokens: TokenReader | None = None,
    ) -> list[Path]:
        """Write the dataset-level files the reader needs; return the paths written. `tokens` reads
        a sample's ids and mask where its file is not under `output_dir`."""
        ...

    def read_tokens(self, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, loss_mask) of one written sample file, read back from the file."""
        ...

    def sample_file_bytes(self, shape: SampleShape) -> int:
        """The exact size of the file `encode` writes for a sample of this shape."""
        ...

    def stored_shapes(self, shape: SampleShape) -> dict[str, list[int]]:
        """The shape of each tensor `encode` writes for a sample of this shape, by name."""
        ...

    def read_stored(self, path: Path) -> StoredSample:
        """What one written sample file holds, mapped rather than read (hsextract.formats.stored)."""
        ...


# --- sizes without writing ----------------------------------------------------------------------


@dataclass(frozen=True)
class SampleShape:
    """What a sample file's size depends on: its token count, its layers and its dataset index."""

    tokens: int
    num_aux: int
    hidden_size: int
    dtype: torch.dtype = torch.bfloat16
    dataset_index: int = 0


class _CountingSink:
    """A write-only file object that keeps only the number of bytes written to it."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.n += n
        return n

    def flush(self) -> None:
        pass


def _probe_hidden(shape: SampleShape) -> int:
    """The smallest hidden size whose ``torch.save`` file has the same overhead as `shape`'s.

    A ``torch.save`` zip aligns each tensor's bytes to 64, and its pickle spends 1, 2, 4 or more
    bytes on each shape, stride and size integer. A hidden size congruent modulo 32 keeps every
    tensor's byte count congruent modulo 64 (so the same padding), and one whose integers fall in
    the same pickle classes keeps the pickle's length: then the two files differ by exactly the
    tensor bytes. So a 7168-wide sample is sized by writing a few-hundred-wide one to nowhere.
    """
    t, k, h = shape.tokens, max(shape.num_aux, 1), shape.hidden_size

    def classes(x: int) -> tuple[int, ...]:
        return tuple(_pickled_int_bytes(v) for v in (x, k * x, t * x, t * k * x, (k + 1) * x, t * (k + 1) * x))

    want = classes(h)
    probe = h % 32 or 32
    while probe < h and classes(probe) != want:
        probe += 32
    return min(probe, h)


def tensor_data_bytes(shape: SampleShape) -> int:
    """Bytes of a sample's tensors: ids and mask (int64), then K + 1 hidden rows, as every format stores them."""
    elem = torch.empty((), dtype=shape.dtype).element_size()
    return 16 * shape.tokens + shape.tokens * (shape.num_aux + 1) * shape.hidden_size * elem


def _overhead_class(shape: SampleShape) -> tuple:
    """Everything the non-tensor bytes of a ``torch.save`` sample file depend on.

    Those bytes are the pickle (whose integers take 1, 2, 4 or more bytes by their size), the zip
    headers, and the padding that aligns each tensor's bytes to 64 (which depends on the byte
    counts modulo 64, so on the token count modulo 64 once the widths are fixed), plus zip64
    records for files past 4 GiB.
    """
    t, k, h = shape.tokens, shape.num_aux, shape.hidden_size
    widths = tuple(_pickled_int_bytes(v) for v in (t, t * h, t * k * h, t * (k + 1) * h, shape.dataset_index))
    return t % 64, k, h, shape.dtype, widths, tensor_data_bytes(shape) >= 1 << 32


_OVERHEAD: dict[tuple, int] = {}


def torch_save_bytes(build: Callable[[SampleShape], Any], shape: SampleShape, key: str) -> int:
    """The size of ``torch.save(build(shape))``, the file of format `key` for a sample of this shape.

    The first sample of each overhead class (`_overhead_class`) is sized by saving an object
    built from uninitialized tensors at a probe width (`_probe_hidden`) to a counting sink: nothing
    is written and only the probe's bytes are read. Its overhead, the bytes beyond the tensors,
    then serves every sample of the class. `build` must be the format's own object builder.
    """
    cls = (key, _overhead_class(shape))
    if cls not in _OVERHEAD:
        probe = _probe_hidden(shape)
        small = SampleShape(shape.tokens, shape.num_aux, probe, shape.dtype, shape.dataset_index)
        sink = _CountingSink()
        torch.save(build(small), sink)  # type: ignore[arg-type]  # any write()/flush() object, as above
        _OVERHEAD[cls] = sink.n - tensor_data_bytes(small)
    return _OVERHEAD[cls] + tensor_data_bytes(shape)


def empty_rows(shape: SampleShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Uninitialized (input_ids [T], loss_mask [T], aux [T, K*H], final [T, H]) of `shape`, for sizing."""
    t, k, h = shape.tokens, shape.num_aux, shape.hidden_size
    return (
        torch.empty(t, dtype=torch.int64),
        torch.empty(t, dtype=torch.int64),
        torch.empty(t, k * h, dtype=shape.dtype),
        torch.empty(t, h, dtype=shape.dtype),
    )


def read_torch_tokens(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, loss_mask) of a ``torch.save`` sample file, mapped rather than read whole."""
    obj = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    return obj["input_ids"].reshape(-1).clone(), obj["loss_mask"].reshape(-1).clone()
