"""The units a person reads numbers in, one spelling everywhere: counts with thousands separators,
sizes in decimal (disks) or binary (memory) units, rates, durations ("1 min 05 s").

Pure functions of a number to a short text, for every module that prints or logs one; the screens
made of them (``hsextract status``, the client's lines) are hsextract.report's.
"""

from __future__ import annotations


def count(n: float | None) -> str:
    """6551 -> "6,551"; 1508.9 -> "1,509"."""
    return "-" if n is None else f"{round(n):,}"


def size(n: float | None) -> str:
    """Bytes in decimal units (as disks and dashboards count): "48.1 MB", "12.35 GB"."""
    if n is None:
        return "-"
    if n < 1e9:
        return f"{n / 1e6:,.1f} MB"
    return f"{n / 1e9:,.2f} GB"


def binary_size(n: float) -> str:
    """Bytes in binary units (as memory and tmpfs sizes are given): "512 B", "1.5 GiB"."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def rate(bytes_per_s: float | None) -> str:
    """A write or read rate in the decimal units of `size`: "48.1 MB/s", "1.23 GB/s"."""
    return "-" if bytes_per_s is None else f"{size(bytes_per_s)}/s"


def seconds(s: float | None) -> str:
    """A short timing, to its tenth of a second: 0.42 -> "0.4 s", 8.44 -> "8.4 s"; a minute or more
    reads as `duration` does ("2 min 07 s"). For what takes seconds (a start-up phase, a bench)."""
    if s is None:
        return "-"
    return f"{s:.1f} s" if s < 59.95 else duration(s)


def duration(seconds: float | None) -> str:
    """45 -> "45 s", 127 -> "2 min 07 s", 11400 -> "3 h 10 min", 200000 -> "2 d 7 h"."""
    if seconds is None:
        return "-"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m:02d} min"
    d, h = divmod(h, 24)
    return f"{d} d {h} h"


def plural(n: int, word: str) -> str:
    """1, "sample" -> "1 sample"; 6551, "token" -> "6,551 tokens"."""
    return f"{count(n)} {word}" + ("" if n == 1 else "s")
