"""The output volume's ceiling: how fast it takes files written the way the drain writes them.

A drain's rate means little alone: 1 GB/s is the whole of one disk and a third of another. `cp -r`
and `sync` are one writer and ``dd`` one stream, so neither is the disk's ceiling. This measures
the drain's own pattern: N writers at once (threads: the writes and fsyncs release the
interpreter), each writing whole files of the run's sample sizes under a temporary name, starting
write-back every few MiB as the drain does (`hsextract.durable.start_writeback`), then fsync, rename
into place and an fsync of the directory. Each writer count is one point; the best point's rate is
the ceiling the drain is held to (bench/, ``hsextract plan --measure-disk``, the suite's drain test).

Bounded and clean: each point stops at a byte count or a time, whichever comes first (a file in
progress is finished), no point writes more than a quarter of the free space, and everything is
written under one hidden directory that is removed when the measurement ends, whatever happens.
"""

from __future__ import annotations

import os
import secrets
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hsextract.durable import WRITEBACK_STEP, fsync_dir, start_writeback
from hsextract.units import rate, size

DEFAULT_WRITERS = (1, 4, 8, 16)
WRITE_BYTES = 8 << 20  # one write(2); the drain's largest (torch.save's tensors; speculators' pieces are 1 MiB)
_PATTERN_BYTES = 64 << 20  # random bytes written over and over (a filesystem that compresses gains nothing)


@dataclass(frozen=True)
class CeilingPoint:
    """One writer count's run: files and bytes made durable, and the seconds from start to the last fsync."""

    writers: int
    files: int
    bytes: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass
class DiskCeiling:
    """Every point of one measurement; `gb_per_s` is the best (the ceiling)."""

    directory: str
    file_sizes: list[int]
    points: list[CeilingPoint] = field(default_factory=list)

    @property
    def best(self) -> CeilingPoint:
        return max(self.points, key=lambda p: p.gb_per_s)

    @property
    def gb_per_s(self) -> float:
        return self.best.gb_per_s

    def as_dict(self) -> dict:
        return {
            "directory": self.directory,
            "disk_ceiling_gb_per_s": round(self.gb_per_s, 3),
            "best_writers": self.best.writers,
            "file_sizes": self.file_sizes,
            "points": [
                {
                    "writers": p.writers,
                    "files": p.files,
                    "bytes": p.bytes,
                    "seconds": round(p.seconds, 3),
                    "gb_per_s": round(p.gb_per_s, 3),
                }
                for p in self.points
            ],
        }

    def summary(self) -> str:
        """One line: the ceiling and each point."""
        each = ", ".join(f"{p.writers}: {p.gb_per_s:.2f}" for p in self.points)
        return (
            f"{self.directory}: ceiling {rate(self.gb_per_s * 1e9)} with {self.best.writers} writers "
            f"(GB/s by writers {each}; files of {_sizes_text(self.file_sizes)}, fsync each, rename, "
            "directory fsync)"
        )


def _sizes_text(sizes: Sequence[int]) -> str:
    lo, hi = min(sizes), max(sizes)
    return size(lo) if lo == hi else f"{size(lo)} to {size(hi)}"


def measure(
    directory: str | Path,
    file_sizes: Sequence[int],
    writers: Sequence[int] = DEFAULT_WRITERS,
    *,
    seconds_per_point: float = 4.0,
    bytes_per_point: int = 4 << 30,
) -> DiskCeiling:
    """Measure the ceiling of the volume holding `directory` (created if missing) with files of
    `file_sizes` bytes (taken in turn), at each writer count of `writers`. OSError (naming the
    directory) when it cannot be written."""
    sizes = sorted({max(1, int(s)) for s in file_sizes})
    if not sizes or not writers:
        raise ValueError("the disk's ceiling needs at least one file size and one writer count")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    work = root / f".hsextract-disk-ceiling-{os.getpid()}-{secrets.token_hex(4)}"
    work.mkdir()
    result = DiskCeiling(str(root), sizes)
    try:
        pattern = memoryview(os.urandom(min(_PATTERN_BYTES, max(sizes))))
        for n in writers:
            budget = min(bytes_per_point, shutil.disk_usage(work).free // 4)
            if budget < min(sizes):
                raise OSError(
                    f"{root}: too little free space to measure the disk's ceiling "
                    f"({shutil.disk_usage(work).free} bytes free)"
                )
            os.sync()  # no dirty pages of the last point (or of anyone else) in this one's time
            result.points.append(_point(work, sizes, int(n), pattern, budget, seconds_per_point))
            shutil.rmtree(work / "files", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _point(
    work: Path, sizes: list[int], writers: int, pattern: memoryview, budget: int, seconds: float
) -> CeilingPoint:
    """`writers` threads writing files until `budget` bytes or `seconds` have passed."""
    tmp, final = work / "tmp", work / "files"
    tmp.mkdir(exist_ok=True)
    final.mkdir(exist_ok=True)
    lock = threading.Lock()
    state = {"next": 0, "files": 0, "bytes": 0}
    errors: list[BaseException] = []
    start = time.perf_counter()

    def claim() -> int | None:
        with lock:
            if errors or state["bytes"] >= budget or time.perf_counter() - start >= seconds:
                return None
            i = state["next"]
            state["next"] += 1
            state["bytes"] += sizes[i % len(sizes)]
            return i

    def writer() -> None:
        try:
            while (i := claim()) is not None:
                _write_one(tmp / f"{i}.tmp", final / f"{i}.bin", sizes[i % len(sizes)], pattern)
                with lock:
                    state["files"] += 1
        except BaseException as exc:  # reported by the caller, with the directory
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=writer, name=f"disk-ceiling-{k}", daemon=True) for k in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise OSError(f"{work}: writing to measure the disk's ceiling failed ({errors[0]})") from errors[0]
    return CeilingPoint(writers, state["files"], state["bytes"], elapsed)


def _write_one(tmp: Path, final: Path, size: int, pattern: memoryview) -> None:
    """One file as the drain writes a sample: written, write-back started every few MiB, fsynced,
    renamed into place, the directory fsynced."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        done = kicked = 0
        while done < size:
            n = min(WRITE_BYTES, size - done, len(pattern))
            done += os.write(fd, pattern[:n])
            if done - kicked >= WRITEBACK_STEP:
                start_writeback(fd, kicked, done - kicked)
                kicked = done
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)
    fsync_dir(final.parent)
