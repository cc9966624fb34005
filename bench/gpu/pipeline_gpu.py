"""The product end to end on a GPU: `hsextract extract` and `hsextract drain` as the units run them,
against a capture server at SGLang's production defaults, on a dataset of realistic varied lengths,
with every sample validated.

What runs, for each model (``--models``: the 8B-shaped Llama and the tiny DeepSeek-V3):

1. servers on the chosen GPUs: a capture server at SGLang's defaults (the overlap scheduler on),
   the same with ``--disable-overlap-schedule``, and a plain server (no capture patch), with the
   parallelism of ``--tp`` / ``--dp-attention``;
2. a generated dataset: conversations of 1 to 3 turns, message lengths drawn from an exponential
   distribution, a share of long ones (several chunks of chunked prefill) and, where the model's
   context allows, a few of 16K-30K tokens;
3. ``correctness``: the real client and drain, as two processes, at each ``--in-flight`` bound
   (the default 32 first) on the overlap server, then at the default on the no-overlap server. The
   drain validates every sample (ids against the client's record, the forward pass's fingerprint,
   finite values, the greedy and the logprob self-check on a share, the drain asking the server for
   the prompts' logprobs as its unit does; the check's numbers are in each run's ``selfcheck``) and
   its run check must pass: the accounts
   reconcile with 0 failed and 0 quarantined. The rows of the overlap run are then compared, sample
   by sample, with the no-overlap run's, and a few samples with transformers;
4. ``throughput`` (``--rounds`` > 0; ``--correctness-models`` to skip step 3 for a model): rounds in a rotating
   order of a plain asyncio loop sending the same encoded prompts to the plain server, of the same
   loop against the overlap and the no-overlap capture servers (a stand-in drain checks each dump's
   ids and fingerprint: what the capture and the overlap scheduler cost at the server), and of the
   whole pipeline on the overlap capture server: the client's own wall time, and the whole
   pipeline's (start of both processes to the drain's exit), the client's start-up, and the
   drain's GB/s beside the disk's own (``dd conv=fsync``);
5. ``tiny`` in ``--models``: the client's ceiling. A tiny Llama on the GPU answers almost at once, so
   the throughput rounds (short prompts, the plain loop against the plain and the capture server,
   and the product) measure how many samples a second one `hsextract extract` process sends, records
   and confirms, against the plain loop's rate.

    python3 bench/gpu/pipeline_gpu.py --bundle .gpu                    # on the GPU host
    python3 bench/gpu/pipeline_gpu.py --device cpu --samples 40        # dry run on a CPU (tiny models)
    python3 bench/gpu/pipeline_gpu.py --bundle .gpu --models tiny --correctness-models none --rounds 3

Results: ``pipeline_gpu.json`` in ``--results`` (bench/results on a GPU) and in ``$OUT`` where set.
Exits 0 only if every correctness run passed.

The code is the package beside this script, ``bench/gpu/pipeline/`` (its ``__init__`` maps the
modules); this file is its command and the names other scripts and the tests import from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO / "bench"), str(REPO / "files" / "python"), str(REPO / "tests")]

from pipeline.case import Case  # noqa: E402
from pipeline.cli import main  # noqa: E402
from pipeline.dataset import encode, write_dataset  # noqa: E402
from pipeline.machine import ceiling_sizes  # noqa: E402
from pipeline.processes import drain_command, free_port, product_env, run_case  # noqa: E402
from pipeline.result import case_result  # noqa: E402
from pipeline.settings import SITE  # noqa: E402
from pipeline.verdict import selfcheck_numbers  # noqa: E402

__all__ = [
    "SITE",
    "Case",
    "case_result",
    "ceiling_sizes",
    "drain_command",
    "encode",
    "free_port",
    "main",
    "product_env",
    "run_case",
    "selfcheck_numbers",
    "write_dataset",
]

if __name__ == "__main__":
    sys.exit(main())
