"""Whether an output's dataset-level files are in step with its manifest.

The samples are the training set's truth, but a trainer reads some sets through files written for
the whole set (the speculators Arrow dataset, every trainer's draft-vocabulary files), rebuilt at
finalize. A finalize that failed (a full volume) leaves them behind the manifest, and a reader
then misses samples or fails. So whoever writes them (the drain, ``hsextract finalize``) records
afterwards how many samples they cover, and ``hsextract status`` calls a run done only when that
is the manifest's count. The record is written after the files, so a crash or a full volume
between the two leaves it behind, never ahead: at worst a finalize too many.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hsextract.durable import atomic_write_json
from hsextract.output.layout import finalized_path


def record_finalized(output: str | Path, samples: int) -> None:
    """The dataset-level files of `output` now cover its first `samples` samples (OSError when the
    record cannot be written: the caller's finalize has then not finished)."""
    atomic_write_json(finalized_path(output), {"samples": int(samples), "written_at": time.time()}, durable=False)


def finalized_samples(output: str | Path) -> int | None:
    """How many samples the dataset-level files were last written for; None when never recorded."""
    try:
        data = json.loads(finalized_path(output).read_text())
        return int(data["samples"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
