"""Kill a working `hsextract drain` with SIGKILL at random instants, restart it, and repeat.

The crash-safety tests of the drain (tests/drain/test_crash_safety.py) and of its draft vocabulary
counts (tests/vocab/test_vocab_drain.py) share this loop; each checks its own invariants after a kill
(``after_kill``) and after the loop.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hsextract.output.manifest import entries_path

from support.drain_proc import start

# How long one round waits for its commits before it kills anyway (a drain that stalls is killed too).
ROUND_WAIT_S = 60


def manifest_lines(out: Path) -> int:
    """How many samples the drain has committed to `out`'s manifest (0 before the first commit)."""
    try:
        return entries_path(out).read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


@dataclass
class KillLoop:
    """What the loop did: its kills, those that landed while dumps were still staged, and the
    indexes it had not released when the deadline came (empty when it released every dump)."""

    kills: int = 0
    kills_while_staged: int = 0
    pending: list[int] = field(default_factory=list)


def kill_drain_repeatedly(
    *,
    hold: Path,
    dump: Path,
    out: Path,
    names: Mapping[int, str],
    drain_args: Sequence[str],
    per_release: int,
    max_delay_s: float,
    rng: random.Random,
    log: Path,
    deadline: float = math.inf,
    after_kill: Callable[[], None] = lambda: None,
) -> KillLoop:
    """Release the staged dumps `names` (dataset index -> name, moved from `hold` into `dump`)
    `per_release` at a time, in index order, as the capture would complete them; for each release,
    start ``hsextract drain --dump-dir dump --output out --format specforge *drain_args`` and kill it
    with SIGKILL, until every dump is released or `deadline` (time.monotonic()) has passed.

    What each kill waits for: the manifest of `out` to hold a random number (0 to one less than the
    release's size) of lines more than it held before the drain started, i.e. that many of the
    released samples committed; or the drain to exit; or ROUND_WAIT_S seconds. Then a random delay,
    uniform in [0, `max_delay_s`), so the kill lands at a random instant of the samples that follow
    (read, write, rename, record). `after_kill` runs once the killed drain has been reaped. The
    drain's stdout and stderr go to `log`.
    """
    result = KillLoop(pending=sorted(names))
    with open(log, "w") as log_file:
        while result.pending and time.monotonic() < deadline:
            release, result.pending = result.pending[:per_release], result.pending[per_release:]
            for i in release:
                os.rename(hold / names[i], dump / names[i])
            target = manifest_lines(out) + rng.randint(0, len(release) - 1)
            proc = start(
                "drain",
                "--dump-dir",
                str(dump),
                "--output",
                str(out),
                "--format",
                "specforge",
                *drain_args,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
            try:
                until = time.monotonic() + ROUND_WAIT_S
                while manifest_lines(out) < target and proc.poll() is None and time.monotonic() < until:
                    time.sleep(0.001)
                time.sleep(rng.uniform(0, max_delay_s))
                if any(p.name.startswith("hsx-") for p in dump.iterdir()):
                    result.kills_while_staged += 1
                os.kill(proc.pid, signal.SIGKILL)
                result.kills += 1
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            after_kill()
    return result
