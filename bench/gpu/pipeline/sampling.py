"""What runs beside the product in threads while it runs: the timeline sampled every half second
(the dumps staged, the drain's own counters) and the reaper that deletes each recorded sample's
file, so that a run can outlast the machine's memory and disk."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path


class Periodic:
    """A daemon thread calling `tick` every `every_s` while its `with` block runs, and once more
    at the end when `tick_at_exit`."""

    tick_at_exit = False

    def __init__(self, every_s: float):
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self.tick_at_exit:
            self.tick()

    def _run(self) -> None:
        while True:
            self.tick()
            if self._stop.wait(self.every_s):
                return

    def tick(self) -> None:
        raise NotImplementedError


class Timeline(Periodic):
    """What the pipeline was doing every half second: the dumps staged, and the drain's own counters
    read from its metrics endpoint (written samples and bytes, dumps waiting, dumps in hand). It shows
    whether the drain fell behind the server steadily or started late, and what the tail after the
    client's end was made of."""

    FIELDS = ("t", "staged", "drain_samples", "drain_gb", "lag", "in_flight")

    def __init__(self, dump_dir: Path, metrics_port: int, t0: float, every_s: float = 0.5):
        super().__init__(every_s)
        self.dump_dir, self.url, self.t0 = Path(dump_dir), f"http://127.0.0.1:{metrics_port}/metrics", t0
        self.rows: list[tuple] = []

    def _metrics(self) -> dict[str, float]:
        import urllib.request

        try:
            with urllib.request.urlopen(self.url, timeout=0.4) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            if line.startswith("hsextract_drain_") and "{" not in line:
                name, _, value = line.partition(" ")
                out[name.removeprefix("hsextract_drain_")] = float(value)
        return out

    def tick(self) -> None:
        try:
            staged = sum(1 for e in os.scandir(self.dump_dir) if not e.name.startswith(("_", ".")))
        except FileNotFoundError:
            staged = 0
        m = self._metrics()
        self.rows.append(
            (
                round(time.monotonic() - self.t0, 2),
                staged,
                m.get("samples_total"),
                round(m["bytes_total"] / 1e9, 3) if "bytes_total" in m else None,
                m.get("lag_dumps"),
                m.get("in_flight"),
            )
        )

    def summary(self, client_done_s: float) -> dict:
        """The timeline, and the facts read from it: when the drain first answered and first wrote,
        the most dumps staged, and the backlog when the client finished."""
        answered = [r for r in self.rows if r[2] is not None]
        wrote = [r for r in answered if r[2] > 0]
        before_end = [r for r in answered if r[0] <= client_done_s]
        return {
            "fields": list(self.FIELDS),
            "rows": self.rows,
            "drain_answered_s": answered[0][0] if answered else None,
            "drain_first_write_s": wrote[0][0] if wrote else None,
            "max_staged": max((r[1] for r in self.rows), default=0),
            "staged_at_client_end": before_end[-1][1] if before_end else None,
            "drain_samples_at_client_end": before_end[-1][2] if before_end else None,
        }


class OutputReaper(Periodic):
    """Deletes each sample's file once the drain has recorded it in the manifest (the line is
    appended after the file is durable, and the drain never opens it again): a run longer than
    the machine's memory and disk can hold (the 8B shape writes 26 MB a sample, 0.85 GB/s). The
    drain's work is unchanged; the training set ends as its manifest, without its files."""

    tick_at_exit = True

    def __init__(self, out: Path, every_s: float = 0.25):
        super().__init__(every_s)
        self.manifest, self.out = out / "manifest.jsonl", out
        self.files = self.bytes = 0
        self._offset = 0

    def tick(self) -> None:
        try:
            with open(self.manifest, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        whole = data[: data.rfind(b"\n") + 1]  # a line still being appended waits for the next look
        self._offset += len(whole)
        for line in whole.splitlines():
            entry = json.loads(line)
            with contextlib.suppress(FileNotFoundError):
                (self.out / entry["file"]).unlink()
                self.files += 1
                self.bytes += int(entry.get("bytes", 0))
