"""One run of the product, described once: a frozen value that the correctness runs, the throughput
rounds and the drafter bench build and `processes.run_case` carries out, instead of a dozen loose
arguments that each caller had to pass in the right order."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from .settings import FORMAT

# The throughput rounds' sides that run the product (the others are the plain loop's).
PRODUCT_SIDES = (
    "pipeline",
    "pipeline_2_processes",
    "client_alone",
    "pipeline_drain_first",
    "pipeline_drain_first_fp8",
    "pipeline_drain_first_fp8_capture",
)
_FP8_SIDES = ("pipeline_drain_first_fp8", "pipeline_drain_first_fp8_capture")


@dataclass(frozen=True)
class Case:
    """What one `hsextract extract` + `hsextract drain` run is asked to do and how its processes start.

    ``processes``: clients side by side, each on its sub-shard (`--process j/P`). ``drain_after``:
    the client alone without a staging limit (``--max-staged 0``), the drain started once it has
    finished. ``drain_first``: the drain started first, the client (and the clock) once the drain
    is up with its worker processes. ``profile``: py-spy samples the (first) client into that file
    (its raw format); ``profile_drain``: the drain and its worker processes into that one.
    ``reap``: each sample's file deleted once the drain has recorded it (`sampling.OutputReaper`).
    ``precision``: how the set stores the rows (``--precision`` of the drain and the client; "fp8"
    needs a format whose reader reads FP8, the speculators layout).
    """

    model: Path
    dataset: Path
    out: Path
    in_flight: int
    max_tokens: int
    format: str = FORMAT
    selfcheck_share: float = 0.05
    processes: int = 1
    drain_after: bool = False
    drain_first: bool = False
    profile: Path | None = None
    profile_drain: Path | None = None
    reap: bool = False
    precision: str = "bf16"

    def for_side(
        self, side: str, out: Path, profile: Path | None = None, profile_drain: Path | None = None, reap: bool = False
    ) -> Case:
        """This case as one throughput round's product ``side`` runs it, its set written to ``out``
        (the rounds self-check 1 % of the samples, the correctness runs 5 %). ``pipeline_drain_first_fp8``
        is ``pipeline_drain_first`` with the rows stored in FP8, quantized by the drain
        (``pipeline_drain_first_fp8_capture``: by the capture, on its own server): side by side, what FP8
        costs or saves the whole pipeline in each place."""
        if side not in PRODUCT_SIDES:
            raise ValueError(f"{side!r} is not a side that runs the product; those are {PRODUCT_SIDES}")
        return dataclasses.replace(
            self,
            out=out,
            selfcheck_share=0.01,
            processes=2 if side == "pipeline_2_processes" else 1,
            drain_after=side == "client_alone",
            drain_first=side in ("pipeline_drain_first", *_FP8_SIDES),
            precision="fp8" if side in _FP8_SIDES else "bf16",
            profile=profile,
            profile_drain=profile_drain,
            reap=reap,
        )
