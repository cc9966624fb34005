"""What would lossless compression of captured bf16 hidden states save, and how fast is it?

Captures the rows the drain writes ([T, K + 1, H]: aux layers [1, 3, 4] and the final hidden
state) from the tiny Llama and DeepSeek-V3 models (transformers on CPU, bf16, the same weights
the SGLang test server runs), plus a Gaussian bf16 control, and compresses each with:

* zstd (levels 1 and 3) on the raw bytes;
* zstd on split byte planes: bf16 is (sign, 8 exponent bits, 7 mantissa bits), so the high bytes
  (sign + exponent + 1 mantissa bit) are few distinct values and compress well while the low
  bytes are close to noise; splitting puts like with like;
* gzip levels 1 and 6 of the raw bytes (6 is SpecForge's own level): what SpecForge's
  ``.ckpt.gz`` (the only compressed form any of the three readers accepts) costs.

Prints saved % and single-thread MB/s (compress and decompress) per method and source; the LAST
line is the best byte-plane saving. Saves bench/results/compression.json.

    python bench/compression.py [--tokens 4096]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "files" / "python"))

import torch  # noqa: E402
import zstandard  # noqa: E402
from hsextract.tiny_model import ensure_tiny_model  # noqa: E402

AUX = [1, 3, 4]  # eagle ids (output of layer i = HF hidden_states[i + 1]) of the 8-layer tiny models


def capture(kind: str, tokens: int) -> bytes:
    """bf16 rows [T, K + 1, H] from a tiny model: aux layer outputs, then the final hidden state."""
    from transformers import AutoModelForCausalLM

    path = ensure_tiny_model(kind, REPO / ".work" / "models" / f"bench-{kind}")
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16)
    model.eval()
    g = torch.Generator().manual_seed(0)
    rows = []
    left = tokens
    while left > 0:
        n = min(512, left)
        ids = torch.randint(10, model.config.vocab_size, (1, n), generator=g)
        with torch.no_grad():
            hs = model(input_ids=ids, output_hidden_states=True).hidden_states
        # transformers returns the final state post-norm (SpecForge's placement); the pre-norm one
        # (speculators') has the residual stream's statistics, like the aux layers here.
        slots = [hs[i + 1][0] for i in AUX] + [hs[-1][0]]
        rows.append(torch.stack(slots, dim=1).to(torch.bfloat16))
        left -= n
    return torch.cat(rows).contiguous().view(torch.uint8).numpy().tobytes()


def split_planes(raw: bytes) -> tuple[bytes, bytes]:
    a = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(-1, 2)
    return a[:, 1].contiguous().numpy().tobytes(), a[:, 0].contiguous().numpy().tobytes()  # high, low (little endian)


def join_planes(high: bytes, low: bytes) -> bytes:
    h = torch.frombuffer(bytearray(high), dtype=torch.uint8)
    lo = torch.frombuffer(bytearray(low), dtype=torch.uint8)
    return torch.stack([lo, h], dim=1).contiguous().numpy().tobytes()


def timed(fn, repeat: int = 3):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def measure(raw: bytes) -> dict[str, dict[str, float]]:
    res = {}
    mb = len(raw) / 1e6
    for level in (1, 3):
        c = zstandard.ZstdCompressor(level=level)
        d = zstandard.ZstdDecompressor()
        comp, tc = timed(lambda c=c: c.compress(raw))
        back, td = timed(lambda d=d, comp=comp: d.decompress(comp))
        assert back == raw
        res[f"zstd-{level}"] = {
            "saved_pct": 100 * (1 - len(comp) / len(raw)),
            "compress_mb_s": mb / tc,
            "decompress_mb_s": mb / td,
        }

        def planes(c=c):
            hi, lo = split_planes(raw)
            return c.compress(hi), c.compress(lo)

        (chi, clo), tc = timed(planes)
        back, td = timed(lambda d=d, chi=chi, clo=clo: join_planes(d.decompress(chi), d.decompress(clo)))
        assert back == raw
        res[f"planes+zstd-{level}"] = {
            "saved_pct": 100 * (1 - (len(chi) + len(clo)) / len(raw)),
            "compress_mb_s": mb / tc,
            "decompress_mb_s": mb / td,
            "high_plane_saved_pct": 100 * (1 - 2 * len(chi) / len(raw)),
            "low_plane_saved_pct": 100 * (1 - 2 * len(clo) / len(raw)),
        }
    for level in (1, 6):
        comp, tc = timed(lambda level=level: gzip.compress(raw, level), repeat=1)
        back, td = timed(lambda comp=comp: gzip.decompress(comp), repeat=1)
        assert back == raw
        res[f"gzip-{level}"] = {
            "saved_pct": 100 * (1 - len(comp) / len(raw)),
            "compress_mb_s": mb / tc,
            "decompress_mb_s": mb / td,
        }
    return {k: {kk: round(vv, 1) for kk, vv in v.items()} for k, v in res.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096, help="tokens captured per model (default 4096)")
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "compression.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    sources = {
        "tiny-llama": capture("llama", a.tokens),
        "tiny-dsv3": capture("dsv3", a.tokens),
        "gaussian-control": (torch.randn(a.tokens, 4, 64) * 2).bfloat16().view(torch.uint8).numpy().tobytes(),
    }
    results = {}
    for name, raw in sources.items():
        results[name] = measure(raw)
        for method, r in results[name].items():
            print(
                f"{name:17s} {method:15s} saved {r['saved_pct']:5.1f} %  compress {r['compress_mb_s']:7.1f} MB/s  "
                f"decompress {r['decompress_mb_s']:7.1f} MB/s"
            )
    best = max(r["planes+zstd-3"]["saved_pct"] for n, r in results.items() if n != "gaussian-control")
    report = {
        "what": "lossless compression of captured bf16 rows [T, 4, 64]; single thread",
        "tokens": a.tokens,
        "cpus": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "results": results,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"best byte-plane zstd saving on captured states: {best:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
