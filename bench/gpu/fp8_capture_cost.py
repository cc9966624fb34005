"""Where FP8 quantization costs less: on the GPU inside the capture, or on the CPU in the drain.

The two places a sample's rows can become FP8 (`hsextract.fp8.quantize`, one float32 scale per token):

* in the capture, on the GPU, before the copy to the host: the forward pass pays the quantization and
  the fingerprint of the FP8 rows, and then copies half the bytes to the host (and the writer, /dev/shm
  and the drain carry half);
* in the drain, on the CPU, after the staged bf16 rows are checked (hsextract.drain.fp8_rows, today's
  place): the forward pass is untouched, the drain's workers pay the quantization per byte.

This times both for a full prefill batch (8,192 tokens) at Llama-3-8B's width (3 aux layers + final,
hidden 4,096) and Kimi-K2.5's (7,168), with CUDA events on the GPU: the capture's `own_batch` in bf16
(concatenation, ids, fingerprint) and in FP8 (the capture's ``precision: fp8``: the same, the block
quantized a piece at a time and the stored rows fingerprinted), its parts apart (the quantization, the
stored rows' fingerprint against the bf16 rows'), and the copy to pinned host memory of the bf16 block
against the FP8 rows and scales. On the CPU,
one thread's rate of the drain's quantization (`FP8Rows.piece`, the fingerprint of the stored rows
included) against its bf16 path's fingerprint alone. It also says whether the GPU's FP8 bytes and
scales equal the CPU's for the same rows (expected: amax is exact, the division and the cast are
correctly rounded float32 operations).

    python3 bench/gpu/fp8_capture_cost.py            # prints JSON (on a GPU; the CPU part alone otherwise)
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "bench")]

import torch  # noqa: E402
from hsextract import fingerprint, fp8  # noqa: E402
from hsextract.capture.core import BatchRequest, CaptureSettings  # noqa: E402
from hsextract.capture.host_stage import own_batch  # noqa: E402
from hsextract.drain.fp8_rows import PIECE_BYTES, FP8Rows  # noqa: E402
from hsextract.layers import resolve  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fingerprint_cost import best_gb_per_s, timed  # noqa: E402  (median ms by CUDA events)

K = 3  # aux layers; rows per token K + 1


def gpu_case(tokens: int, hidden: int) -> dict:
    """The capture's device work and its copy to the host, bf16 against FP8, for one batch."""
    settings = CaptureSettings(rid_prefix="hsx", layers=resolve(None, 32), hidden_size=hidden)
    settings_fp8 = dataclasses.replace(settings, precision="fp8")
    gen = torch.Generator(device="cuda").manual_seed(0)
    aux = torch.randn(tokens, K * hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    final = 8 * torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    ids = torch.randint(0, 100_000, (tokens + 128,), device="cuda", generator=gen)
    lens = torch.tensor([tokens], device="cuda", dtype=torch.int32)
    reqs = [BatchRequest("hsx-ab12cd34-0", 0, 0, tokens, 0)]
    block = torch.cat([aux.view(tokens, K, hidden), final.view(tokens, 1, hidden)], dim=1)
    row_ids = ids[:tokens]
    q, scales = fp8.quantize(block)
    weight = torch.randn(4 * hidden, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    host_bf16 = torch.empty(block.numel() * 2, dtype=torch.uint8, pin_memory=True)
    host_fp8 = torch.empty(q.numel() + 4 * tokens, dtype=torch.uint8, pin_memory=True)

    def copy_bf16() -> None:
        host_bf16.copy_(block.view(-1).view(torch.uint8), non_blocking=True)

    def copy_fp8() -> None:
        host_fp8[: q.numel()].copy_(q.view(-1).view(torch.uint8), non_blocking=True)
        host_fp8[q.numel() :].copy_(scales.view(-1).view(torch.uint8), non_blocking=True)

    own = timed(lambda: own_batch(settings, reqs, aux, final, ids, lens))
    own_fp8 = timed(lambda: own_batch(settings_fp8, reqs, aux, final, ids, lens))
    quant = timed(lambda: fp8.quantize(block))
    values = timed(lambda: fp8.stored_row_values(q, scales, row_ids))
    bf16_values = timed(lambda: fingerprint.row_values(block, row_ids))
    cb, cf = timed(copy_bf16), timed(copy_fp8)
    matmul = timed(lambda: final @ weight.t())
    cpu_q, cpu_s = fp8.quantize(block.cpu())
    same_rows = int((q.cpu().view(torch.uint8) != cpu_q.view(torch.uint8)).sum())
    same_scales = int((scales.cpu() != cpu_s).sum())
    owned = own_batch(settings_fp8, reqs, aux, final, ids, lens)  # the capture's own FP8 rows, as staged
    staged_differ = int((owned.block.cpu().view(torch.uint8) != cpu_q.view(torch.uint8)).sum())
    return {
        "tokens": tokens,
        "hidden": hidden,
        "bf16_block_mb": round(block.numel() * 2 / 1e6, 1),
        "fp8_rows_and_scales_mb": round((q.numel() + 4 * tokens) / 1e6, 1),
        "own_batch_bf16_ms": round(own, 3),
        "own_batch_fp8_ms": round(own_fp8, 3),
        "fp8_adds_to_own_batch_ms": round(own_fp8 - own, 3),
        "quantize_ms": round(quant, 3),
        "fp8_row_values_ms": round(values, 3),
        "bf16_row_values_ms": round(bf16_values, 3),
        "copy_to_host_bf16_ms": round(cb, 3),
        "copy_to_host_fp8_ms": round(cf, 3),
        "one_up_projection_matmul_ms": round(matmul, 3),
        "gpu_fp8_bytes_differing_from_cpu": same_rows,
        "gpu_scales_differing_from_cpu": same_scales,
        "own_batch_fp8_bytes_differing_from_cpu": staged_differ,
    }


def cpu_case(tokens: int, hidden: int, repeats: int = 5) -> dict:
    """One thread's GB/s of bf16 staged rows: the drain's FP8 path (quantize + fingerprint of the stored
    rows, `FP8Rows.piece` in pieces of PIECE_BYTES) against the bf16 path's fingerprint of the rows."""
    torch.set_num_threads(1)
    rows = torch.randn(tokens, K + 1, hidden, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    ids = torch.arange(tokens, dtype=torch.int64)
    raw = rows.reshape(tokens, -1).view(torch.uint8).numpy()
    row_bytes = raw.shape[1]
    step = max(1, PIECE_BYTES // row_bytes)

    def fp8_path() -> None:
        q = FP8Rows(tokens, K + 1, hidden, torch.bfloat16, ids)
        for a in range(0, tokens, step):
            q.piece(a, rows[a : a + step])
        q.finish()

    def bf16_path() -> None:
        fingerprint.row_values_np(raw, ids.numpy(), row_bytes)

    return {
        "tokens": tokens,
        "hidden": hidden,
        "drain_fp8_gb_per_s_one_thread": round(best_gb_per_s(fp8_path, raw.nbytes, repeats), 3),
        "drain_bf16_fingerprint_gb_per_s_one_thread": round(best_gb_per_s(bf16_path, raw.nbytes, repeats), 3),
    }


def main() -> int:
    out: dict = {"benchmark": "fp8_capture_cost", "torch": torch.__version__}
    if torch.cuda.is_available():
        out["device"] = torch.cuda.get_device_name(0)
        out["gpu"] = [gpu_case(8192, 4096), gpu_case(8192, 7168)]
    out["cpu"] = [cpu_case(2048, 4096)]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
