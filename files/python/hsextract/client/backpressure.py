"""Decide when the client must stop sending because the staging area (/dev/shm) is filling up.

The captured states land in RAM (/dev/shm) and the drain moves them to disk. If the drain lags
(a slow disk, a crash) or the ramdisk is small, sending more requests would fill it and take the
host down with it. So before each request the client checks two limits and waits, saying why,
until both hold again:

* free space on the dump dir's filesystem, minus what the requests already in flight will
  write, stays above a watermark (bytes, or a percentage of the filesystem);
* the number of this run's staged dumps plus requests in flight stays within a limit, so a
  stalled drain is noticed before memory is. Dumps of other runs sharing the directory are not
  this run's to wait for (their drain takes them); they count only through the free space.

A client stopped by the staged limit sends again once its dumps fall an eighth below it
(`resume_below`), and looks every 20 ms for the first seconds of a pause (`pause_poll_s`). A
client that looked every half second, and sent again at the limit itself, ran at half the
pace of the same client alone against a tiny GPU model: the drain emptied the staging area in a
fraction of each half second and waited (bench/gpu/pipeline_gpu.py's timeline,
bench/results/pipeline_gpu_drain_start.json).

Counting the staged dumps lists the directory: milliseconds with a few hundred staged, too much
before every request of a client sending hundreds a second. So the count is kept between looks,
with every request let through since counted as one more dump (an upper bound for this process:
the drain only takes dumps away), and the directory is listed again when that bound reaches the
limit (the limit is then exact) or the count is older than `RECOUNT_S` (dumps of the run's other
client processes, on their sub-shards, are seen within that).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hsextract.errors import ConfigError
from hsextract.staging.dumps import iter_dump_dirs, run_dumps
from hsextract.units import binary_size

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# The longest a count of the staged dumps is used (see the module's docstring).
RECOUNT_S = 0.25
# While paused: how often to look again, early in a pause (a drain merely behind frees room within
# milliseconds) and once it has lasted (a stalled drain: no need to list staging 50 times a second).
PAUSE_POLL_S = (0.02, 0.25)
PAUSE_POLL_FAST_FOR_S = 2.0
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Watermark:
    """A free-space floor: absolute bytes, or a fraction of the filesystem's size."""

    bytes: int = 0
    fraction: float = 0.0

    def floor(self, total_bytes: int) -> int:
        return self.bytes if not self.fraction else int(total_bytes * self.fraction)

    def __str__(self) -> str:
        return f"{self.fraction * 100:g}%" if self.fraction else binary_size(self.bytes)


def parse_watermark(value: str | int | float) -> Watermark:
    """Parse ``"50%"``, ``"2G"``, ``"512MiB"`` or a byte count into a Watermark."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Watermark(bytes=int(value))
    text = str(value).strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            pct = -1.0
        if not 0 <= pct < 100:
            raise ConfigError(f"shm watermark {value!r}: a percentage must be in [0, 100), e.g. 10%")
        return Watermark(fraction=pct / 100)
    m = _SIZE_RE.match(text)
    if not m:
        raise ConfigError(
            f"shm watermark {value!r}: expected bytes (e.g. 2G, 512M, 1048576) or a percentage (e.g. 10%)"
        )
    return Watermark(bytes=int(float(m[1]) * _UNITS[m[2].lower()]))


def pause_poll_s(paused_for_s: float) -> float:
    """Seconds to wait before looking again, `paused_for_s` into a pause."""
    return PAUSE_POLL_S[0] if paused_for_s < PAUSE_POLL_FAST_FOR_S else PAUSE_POLL_S[1]


def resume_below(max_staged: int) -> int:
    """The staged dumps (plus requests in flight) under which a client stopped at `max_staged` sends
    again: an eighth below it, so that it sends in batches while the drain takes dumps in batches
    (at the limit itself, it would list staging before every request)."""
    return max(1, max_staged - max(1, max_staged // 8))


class Backpressure:
    """Answers "may I send now?" for one dump dir; `reason()` is None when sending is fine."""

    def __init__(
        self,
        dump_dir: str | Path,
        min_free: Watermark,
        max_staged: int | None,
        bytes_per_token: int,
        run_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.dump_dir = Path(dump_dir)
        self.min_free = min_free
        self.max_staged = max_staged
        self.bytes_per_token = bytes_per_token
        self.run_id = run_id  # count only this run's dumps (None: every dump)
        self._clock = clock
        self._counted: int | None = None  # the staged dumps at the last look
        self._counted_at = 0.0
        self._sent_since = 0  # requests let through since that look

    def free_bytes(self) -> tuple[int, int]:
        st = os.statvfs(self.dump_dir)
        return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize

    def staged(self) -> int:
        if self.run_id is None:
            return sum(1 for _ in iter_dump_dirs(self.dump_dir))
        return sum(1 for _ in run_dumps(self.dump_dir, self.run_id))

    def reason(
        self, inflight_requests: int = 0, inflight_tokens: int = 0, next_tokens: int = 0, paused: bool = False
    ) -> str | None:
        """Why the next request (of `next_tokens`) must wait, or None if it may go now. A client
        `paused` by the staged limit waits until it is `resume_below` it."""
        free, total = self.free_bytes()
        floor = self.min_free.floor(total)
        expected = (inflight_tokens + next_tokens) * self.bytes_per_token
        if free - expected < floor:
            return (
                f"dump dir {self.dump_dir}: {binary_size(free)} free, {binary_size(expected)} expected from requests "
                f"in flight, below the watermark {self.min_free} ({binary_size(floor)})"
            )
        if self.max_staged is not None:
            limit = resume_below(self.max_staged) if paused else self.max_staged
            staged = self._staged_bound()
            if staged + inflight_requests >= limit:
                staged = self._recount()
            if staged + inflight_requests >= limit:
                again = f"; sending again below {limit}" if paused else ""
                return (
                    f"{staged} staged dumps + {inflight_requests} in flight reach the limit {self.max_staged} "
                    f"(the drain is behind){again}"
                )
        self._sent_since += 1  # the caller sends now
        return None

    def _staged_bound(self) -> int:
        """At least as many staged dumps as this process has made (see the module's docstring)."""
        if self._counted is None or self._clock() - self._counted_at >= RECOUNT_S:
            return self._recount()
        return self._counted + self._sent_since

    def _recount(self) -> int:
        self._counted, self._counted_at, self._sent_since = self.staged(), self._clock(), 0
        return self._counted
