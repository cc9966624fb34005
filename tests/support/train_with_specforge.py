"""Train an EAGLE-3 drafter on a training set with SpecForge's own trainer, on a CPU, then export it
for SGLang (run in a subprocess, PYTHONPATH=<readers>/specforge).

Usage: python train_with_specforge.py RUN_YAML EXPORT_DIR RESULT_JSON [section.field=value ...]

It runs ``specforge train -c RUN_YAML`` and ``specforge export --to sglang`` as a user runs them
(SpecForge 0.2.0's own CLI, config schema, offline reader, vocabulary mapping, draft model, TTT
loop, optimizer, checkpoint and exporter), with three things a CPU needs:

* ``training.fsdp_sharding=NO_SHARD``: SpecForge's own switch from FSDP (which needs an
  accelerator) to DDP over gloo;
* ``training.attention_backend=sdpa``: its default, flex attention, has no backward on a CPU;
* its loss, ``specforge.core.loss.LogSoftmaxLoss``, a Triton kernel (Triton has no CPU driver),
  replaced by the same sum in torch: ``-(target * log_softmax(logits)).sum(-1)`` per position, masked,
  averaged over every position, as the kernel computes it.

RESULT_JSON gets each logged step's metrics (``steps``), the checkpoint directory and the
exported draft's config and vocabulary mapping (as lists), so the test can compare them with the set.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from pathlib import Path

import torch


class TorchLogSoftmaxLoss:
    """SpecForge's KL loss in torch (its kernel's forward, with autograd for the backward)."""

    @staticmethod
    def apply(logits: torch.Tensor, target: torch.Tensor, position_mask: torch.Tensor) -> torch.Tensor:
        log_p = torch.log_softmax(logits.float(), dim=-1)
        per_position = -(target.float() * log_p).sum(-1) * position_mask.reshape(logits.shape[:2]).float()
        return per_position.mean()


CPU_OVERRIDES = ["training.fsdp_sharding=NO_SHARD", "training.attention_backend=sdpa", "data.dataloader_num_workers=0"]


def patch_loss() -> None:
    """SpecForge's Triton loss replaced by `TorchLogSoftmaxLoss` (for a CPU)."""
    import specforge.algorithms.eagle3.model as eagle3_model

    eagle3_model.LogSoftmaxLoss = TorchLogSoftmaxLoss  # type: ignore[assignment]


def main() -> int:
    run_yaml, export_dir, result_path, *overrides = sys.argv[1:]
    from specforge.cli import main as specforge

    patch_loss()
    overrides = [*CPU_OVERRIDES, *overrides]
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        rc = specforge(["train", "-c", run_yaml, *overrides])
    sys.stdout.write(log.getvalue())
    if rc:
        return rc
    steps = [
        json.loads(re.sub(r"'", '"', m.group(2))) | {"step": int(m.group(1))}
        for m in re.finditer(r"^step (\d+): (\{.*\})$", log.getvalue(), re.M)
    ]
    cfg = _yaml(run_yaml, overrides)
    checkpoint = Path(cfg["output_dir"]) / f"{cfg['run_id']}-latest"
    rc = specforge(
        [
            "export",
            "--to",
            "sglang",
            "--checkpoint",
            str(checkpoint),
            "--draft-config",
            cfg["draft_model_config"],
            "--output-dir",
            export_dir,
            "--vocab-mapping",
            cfg["vocab_mapping_path"],
        ]
    )
    if rc:
        return rc
    from safetensors.torch import load_file

    weights = load_file(str(Path(export_dir) / "model.safetensors"))
    result = {
        "steps": steps,
        "checkpoint": str(checkpoint),
        "config": json.loads((Path(export_dir) / "config.json").read_text()),
        "d2t": weights["d2t"].tolist(),
        "t2d": weights["t2d"].tolist(),
        "weights": sorted(weights),
    }
    Path(result_path).write_text(json.dumps(result))
    return 0


def _yaml(path: str, overrides: list[str]) -> dict[str, str]:
    """The few settings this script needs from the run file (after the command line's overrides)."""
    from specforge.config import load_config

    cfg = load_config(path, overrides)
    return {
        "output_dir": cfg.output_dir,
        "run_id": cfg.run_id,
        "draft_model_config": cfg.model.draft_model_config,
        "vocab_mapping_path": cfg.model.vocab_mapping_path,
    }


if __name__ == "__main__":
    raise SystemExit(main())
