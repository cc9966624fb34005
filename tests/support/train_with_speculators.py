"""Train an EAGLE-3 drafter on training sets with speculators' own trainer, on a CPU (run in a
subprocess, PYTHONPATH=<readers>/speculators).

Usage: python train_with_speculators.py RUNS_JSON RESULT_JSON

RUNS_JSON is {name: [the arguments of `speculators train`]}; each run is
``main(TrainConfig.resolve(arguments))``, what ``speculators train ARGUMENTS`` calls (speculators
0.9.0's own config resolution, hidden-states backend, vocabulary mapping, ArrowDataset, packing
sampler, collate function with ``shift_batch``, Eagle3 draft model, TTT loss, optimizer, scheduler
and checkpoint), one after the other in this one process (its imports cost about 10 CPU-seconds).
A CPU needs the arguments ``--draft-attn-impl sdpa`` and ``--loss-implementation eager`` (the
trainer's own switches off flex attention and the Triton loss) and ``--num-workers 0``, and, patched
here, where the trainer puts things (`on_cpu`): the trainer sends the model and each batch to the
accelerator of its local rank, autocasts for the accelerator's type and synchronizes it to time each
logged step; here the device is the CPU and there is nothing to synchronize. Nothing else is changed.

RESULT_JSON gets, for each run, the metrics the trainer logged for each step (``steps``: its
``train`` dict, with ``loss``), for its validation epoch (``val``), and the class of the transfer
the trainer read the hidden states through (``transfer``).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import torch


def on_cpu() -> None:
    """The trainer's device is the CPU: model and batches go there (not to accelerator index 0),
    autocast is the CPU's, and the step timer's accelerator synchronize is a no-op."""
    import speculators.train.trainer as trainer

    cpu = torch.device("cpu")
    trainer.get_local_rank = lambda: cpu  # type: ignore[assignment]
    init = trainer.Trainer.__init__

    def init_on_cpu(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.device_type = "cpu"

    trainer.Trainer.__init__ = init_on_cpu  # type: ignore[method-assign]
    if not torch.accelerator.is_available():
        torch.accelerator.synchronize = lambda *a, **k: None  # type: ignore[assignment]


class Metrics(logging.Handler):
    """What the trainer logs to its metric logger, ``speculators.metrics``: a dict a record."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict):
            self.records.append(record.msg)


def train(argv: list[str]) -> dict:
    import speculators.train.cli as cli
    from speculators.train.config import TrainConfig

    metrics, seen = Metrics(), {}
    setup_metric_logger, create_loaders = cli.setup_metric_logger, cli.create_train_val_loaders

    def with_our_handler(*args, **kwargs):
        setup_metric_logger(*args, **kwargs)  # the trainer's own logging.config, then ours beside it
        logging.getLogger("speculators.metrics").addHandler(metrics)

    def loaders(**kwargs):
        seen["transfer"] = type(kwargs["transfer"]).__name__
        return create_loaders(**kwargs)

    cli.setup_metric_logger, cli.create_train_val_loaders = with_our_handler, loaders
    try:
        cli.main(TrainConfig.resolve(argv))
    finally:
        cli.setup_metric_logger, cli.create_train_val_loaders = setup_metric_logger, create_loaders
        logging.getLogger("speculators.metrics").removeHandler(metrics)
    steps = [dict(r["train"], global_step=r["global_step"]) for r in metrics.records if "train" in r]
    val = [r["val"] for r in metrics.records if "val" in r]
    return {"steps": steps, "val": val, "transfer": seen.get("transfer")}


def main() -> int:
    runs_path, result_path = sys.argv[1:]
    runs = json.loads(Path(runs_path).read_text())
    on_cpu()
    results = {name: train(argv) for name, argv in runs.items()}
    Path(result_path).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
