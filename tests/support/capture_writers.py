"""Capture writers fed directly with made-up batches, as the writer tests use them: no server, the
rows on the CPU, in either kind of writer (threads in this process, or a writer process)."""

from __future__ import annotations

import torch
from hsextract.capture.core import CaptureSettings
from hsextract.capture.sink import WriterOptions
from hsextract.capture.writer import CaptureWriter
from hsextract.capture.writer_process import ProcessCaptureWriter
from hsextract.layers import resolve

H = 16  # hidden size
K = 3  # aux layers (resolve's default for 8 layers)
MODES = ("in_process", "writer_process")


def make_writer(dump_dir, mode: str = "in_process", **kw) -> CaptureWriter | ProcessCaptureWriter:
    s = CaptureSettings(rid_prefix="hsx", layers=resolve(None, 8), hidden_size=H, architecture="LlamaForCausalLM")
    kind = CaptureWriter if mode == "in_process" else ProcessCaptureWriter
    return kind(dump_dir, s, WriterOptions(**kw), device="cpu")


def batch(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Aux rows [rows, K*H], final rows [rows, H] (bfloat16) and token ids of a made-up batch."""
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(rows, K * H, generator=g).to(torch.bfloat16)
    final = torch.randn(rows, H, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, 300, (rows,), generator=g)
    return aux, final, ids
