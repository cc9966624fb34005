"""What the capture's own copies and the fingerprint cost the forward pass, on the GPU.

Inside the decoder's hook the capture concatenates a batch's rows into one block (it always did),
and since the overlap fix it also copies the token ids and takes each row's fingerprint value (one
reduction over the block, `hsextract.fingerprint.row_values`). This times, with CUDA events, the
hook's device work for a full prefill batch (8,192 tokens) at Llama-3-8B's width (3 aux layers +
final, hidden 4,096) and at Kimi-K2.5's (hidden 7,168): the concatenation alone, and the whole of
`own_batch`, beside one layer's worth of matmul of the same batch for scale.

    python3 bench/gpu/fingerprint_cost.py   # prints JSON
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "files" / "python"))

import torch  # noqa: E402
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

    block_mb = tokens * (k + 1) * hidden * 2 / 1e6
    c, w, m = timed(concat_only), timed(whole), timed(one_matmul)
    return {"tokens": tokens, "hidden": hidden, "block_mb": round(block_mb, 1), "concat_ms": round(c, 3),
            "own_batch_ms": round(w, 3), "added_by_ids_and_fingerprint_ms": round(w - c, 3),
            "one_up_projection_matmul_ms": round(m, 3)}


def main() -> int:
    if not torch.cuda.is_available():
        print(json.dumps({"error": "needs a CUDA device"}))
        return 1
    out = {"benchmark": "fingerprint_cost", "gpu": torch.cuda.get_device_name(0),
           "cases": [case(8192, 4096), case(8192, 7168), case(1024, 4096)],
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
