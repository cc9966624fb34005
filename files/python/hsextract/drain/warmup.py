"""A drain process warm before it says it is ready: one made-up sample through the whole preparation.

A process that has imported its modules still pays, at its first sample, for everything done once:
the lazy imports inside torch's save and numpy's and xxhash's first calls, the first allocation of
each size, the format's first encode. Spread over eight worker processes that said "started", that
made the drain's first seconds slower than its steady state (issue 40). So each process (and the
drain's own, before it says "running") prepares one sample of two rows that it makes itself, in
its temporary directory, exactly as it will prepare the real ones (read, check, encode, hash,
write, fsync), and removes it; a failure there is a failure to start, said at once, not at the
first real sample.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from hsextract.drain import validate as v
from hsextract.drain.prepare import Job, Ready, prepare
from hsextract.formats.base import OutputFormat
from hsextract.output.manifest import default_checksum_algorithm
from hsextract.staging.dumps import DONE_FILE, STATES_FILE, DoneMarker, StateFileLayout
from hsextract.staging.records import SampleRecord

_ROWS, _SLOTS, _HIDDEN = 2, 2, 64


def warm_up(fmt: OutputFormat, tmp_dir: Path, precision: str = "bf16") -> None:
    """Prepare one made-up sample of `fmt` (its rows stored in `precision`) in `tmp_dir`, then remove
    everything it made; RuntimeError saying what went wrong if the preparation did not produce a sample."""
    import numpy as np

    from hsextract import fingerprint

    work = Path(tmp_dir) / f".warm-up-{os.getpid()}"
    rid = f"warm-up-{os.getpid()}"
    try:
        dump = work / rid
        dump.mkdir(parents=True)
        layout = StateFileLayout(_ROWS, _SLOTS, _HIDDEN)
        rows = (np.arange(_ROWS * _SLOTS * _HIDDEN, dtype=np.float32).reshape(_ROWS, -1) / 64).astype(np.float32)
        bf16 = (rows.view(np.uint32) >> 16).astype(np.uint16)  # the float32 values' bfloat16 halves
        ids = np.arange(_ROWS, dtype=np.int64)
        with open(dump / STATES_FILE, "wb") as f:
            f.write(layout.header)
            f.write(bf16.tobytes())
            f.write(ids.tobytes())
        marker = DoneMarker(
            rid=rid,
            prompt_len=_ROWS,
            num_aux=_SLOTS - 1,
            hidden_size=_HIDDEN,
            dtype="bfloat16",
            eagle_aux_hidden_state_layer_ids=[1],
            sglang_layers_to_capture=[2],
            num_hidden_layers=4,
            final_hidden=fmt.final_hidden,
            architecture="warm-up",
            fingerprint=fingerprint.of_rows(bf16.view(np.uint8), ids, layout.row_bytes),
        )
        (dump / DONE_FILE).write_text(marker.to_json())
        record = SampleRecord(rid=rid, index=0, input_ids=ids.tolist(), loss_mask=[0, 1])
        expected = v.Expected(final_hidden=fmt.final_hidden)
        job = Job(dump, record, expected, default_checksum_algorithm(), True, precision=precision)
        outcome = prepare(fmt, work, job)
        if not isinstance(outcome, Ready):
            raise RuntimeError(f"the drain's warm-up sample of format {fmt.name} was not prepared: {outcome}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
