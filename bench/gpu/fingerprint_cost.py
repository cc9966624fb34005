"""What the capture's own copies and the fingerprint cost the forward pass, on the GPU.

Inside the decoder's hook the capture concatenates a batch's rows into one block (it always did),
and since the overlap fix it also copies the token ids and takes each row's fingerprint value (one
reduction over the block, `hsextract.fingerprint.row_values`). This times, with CUDA events, the
hook's device work for a full prefill batch (8,192 tokens) at Llama-3-8B's width (3 aux layers +
final, hidden 4,096) and at Kimi-K2.5's (hidden 7,168): the concatenation alone, and the whole of
`own_batch`, beside one layer's worth of matmul of the same batch for scale. Each case also times
the row values alone, as version 2 defines them (each word times its weight) and as version 1 did
(the words' plain sum), so the weights' own cost shows.

The CPU part (``--device cpu``, or where there is no GPU) times what the CPU pays per byte: the
writer's check of each row it writes and the drain's fingerprint of each sample, both
`row_values_np` on one thread, version 2 against version 1 and against a plain copy of the bytes.

    python3 bench/gpu/fingerprint_cost.py                 # prints JSON (the GPU part)
    python3 bench/gpu/fingerprint_cost.py --device cpu    # the CPU part
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "bench")]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hsextract import fingerprint  # noqa: E402
from hsextract.capture.core import BatchRequest, CaptureSettings  # noqa: E402
from hsextract.capture.host_stage import own_batch  # noqa: E402
from hsextract.layers import resolve  # noqa: E402


def timed(fn, repeats: int = 20) -> float:
    """Median milliseconds of ``fn`` on the current stream (CUDA events)."""
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def case(tokens: int, hidden: int) -> dict:
    k = 3
    settings = CaptureSettings(rid_prefix="hsx", layers=resolve(None, 32), hidden_size=hidden)
    aux = torch.randn(tokens, k * hidden, device="cuda", dtype=torch.bfloat16)
    final = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 100_000, (tokens + 128,), device="cuda")
    lens = torch.tensor([tokens], device="cuda", dtype=torch.int32)
    reqs = [BatchRequest("hsx-ab12cd34-0", 0, 0, tokens, 0)]
    weight = torch.randn(4 * hidden, hidden, device="cuda", dtype=torch.bfloat16)

    def concat_only() -> None:
        torch.cat([aux.view(tokens, k, hidden), final.view(tokens, 1, hidden)], dim=1)

    def whole() -> None:
        own_batch(settings, reqs, aux, final, ids, lens)

    def one_matmul() -> None:  # an MLP up-projection's worth of the same batch, for scale
        final @ weight.t()

    block = torch.cat([aux.view(tokens, k, hidden), final.view(tokens, 1, hidden)], dim=1)
    row_ids = ids[:tokens]

    def values_v2() -> None:
        fingerprint.row_values(block, row_ids)

    def values_v1() -> None:  # version 1: the words' plain sum
        block.reshape(tokens, -1).view(torch.int64).sum(dim=1) + row_ids * 7

    block_mb = tokens * (k + 1) * hidden * 2 / 1e6
    c, w, m = timed(concat_only), timed(whole), timed(one_matmul)
    v2, v1 = timed(values_v2), timed(values_v1)
    return {
        "tokens": tokens,
        "hidden": hidden,
        "block_mb": round(block_mb, 1),
        "concat_ms": round(c, 3),
        "own_batch_ms": round(w, 3),
        "added_by_ids_and_fingerprint_ms": round(w - c, 3),
        "row_values_v2_ms": round(v2, 3),
        "row_values_v1_ms": round(v1, 3),
        "one_up_projection_matmul_ms": round(m, 3),
    }


def best_gb_per_s(fn, nbytes: int, repeats: int) -> float:
    """GB/s of ``nbytes`` by ``fn``'s best time of ``repeats`` on the CPU, after one run to warm it."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return nbytes / min(times) / 1e9


def cpu_case(tokens: int, hidden: int, repeats: int = 7) -> dict:
    """One thread's rate of `row_values_np` (version 2), of version 1's plain sums, and of a copy."""
    torch.set_num_threads(1)
    row_bytes = 4 * hidden * 2
    raw = np.random.default_rng(0).integers(0, 255, size=tokens * row_bytes, dtype=np.uint8)
    ids = np.arange(tokens, dtype=np.int64)
    out = np.empty_like(raw)

    def best(fn) -> float:
        return best_gb_per_s(fn, raw.nbytes, repeats)

    v2 = best(lambda: fingerprint.row_values_np(raw, ids, row_bytes))
    v1 = best(lambda: raw.view(np.int64).reshape(tokens, -1).sum(axis=1) + ids * 7)
    copy = best(lambda: np.copyto(out, raw))
    return {
        "tokens": tokens,
        "hidden": hidden,
        "sample_mb": round(raw.nbytes / 1e6, 1),
        "v2_gb_per_s": round(v2, 2),
        "v1_gb_per_s": round(v1, 2),
        "copy_gb_per_s": round(copy, 2),
        "v2_time_over_v1": round(v1 / v2, 3),
        "v2_time_over_copy": round(copy / v2, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args()
    if args.device == "cpu":
        from common import machine_info

        out = {
            "benchmark": "fingerprint_cost_cpu",
            "threads": 1,
            "cases": [cpu_case(2048, 4096), cpu_case(2048, 7168), cpu_case(256, 4096)],
            "machine": machine_info(),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        _emit(out, args.json)
        return 0
    out = {
        "benchmark": "fingerprint_cost",
        "gpu": torch.cuda.get_device_name(0),
        "cases": [case(8192, 4096), case(8192, 7168), case(1024, 4096)],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _emit(out, args.json)
    return 0


def _emit(out: dict, path: Path | None) -> None:
    print(json.dumps(out))
    if path is not None:
        path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
