"""What ``--to-bf16`` costs per sample: an FP8 file made a verified bf16 file of its own format
(speculators) and of SpecForge's (the final state through the model's norm), side by side.

One FP8 speculators file of an 8B-shaped sample (K + 1 = 4 slots of 4,096, ``--tokens`` tokens)
is written as the drain writes it; each case then runs `Bf16Conversion.verified` on it (read,
dequantize, the norm for SpecForge, encode, write durably, read back and check the size, checksum,
shapes and fingerprint), as collect and pull do for every sample, on one thread. Prints the FP8
bytes read per second for each case and their ratio, best of ``--repeats``; the files live in
``--dir`` (default: a temporary directory; give one on the disk a pull writes to).

    python bench/to_bf16_cost.py [--tokens 2048] [--repeats 5] [--dir /var/tmp/x]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "tests")]

import torch  # noqa: E402
from hsextract import fingerprint, fp8  # noqa: E402
from hsextract.formats import get_format  # noqa: E402
from hsextract.formats.base import Sample  # noqa: E402
from hsextract.formats.to_bf16 import bf16_conversion  # noqa: E402
from hsextract.output.manifest import ManifestEntry, ManifestHeader, checksum_file  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

HIDDEN, SLOTS = 4096, 4


def fp8_sample(work: Path, tokens: int) -> tuple[ManifestHeader, Path, ManifestEntry]:
    """An FP8 speculators file of `tokens` tokens and its manifest row, as the drain writes them."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(tokens, SLOTS, HIDDEN, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, 128000, (tokens,), generator=g)
    q, scales = fp8.quantize(rows)
    header = ManifestHeader(
        format="speculators",
        final_hidden="pre_norm",
        dtype="bfloat16",
        hidden_size=HIDDEN,
        num_aux=SLOTS - 1,
        eagle_aux_hidden_state_layer_ids=[1, 15, 28],
        sglang_layers_to_capture=[2, 16, 29],
        num_hidden_layers=32,
        precision="fp8",
        checksum_algorithm="xxh3_128",
    )
    fmt = get_format("speculators")
    path = work / fmt.relative_path(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    sample = Sample("r0", 0, ids, torch.ones(tokens, dtype=torch.int64), q, scales=scales)
    from hsextract.durable import write_payload_durably
    from hsextract.output.manifest import new_hasher

    write_payload_durably(path, fmt.encode(sample), new_hasher("xxh3_128"))
    entry = ManifestEntry(
        output_index=0,
        dataset_index=0,
        rid="r0",
        tokens=tokens,
        file=fmt.relative_path(0),
        bytes=path.stat().st_size,
        checksum=f"xxh3_128:{checksum_file(path, 'xxh3_128')}",
        fingerprint=fingerprint.to_text(0),
    )
    return header, path, entry


def model_dir(work: Path) -> Path:
    """A model directory with the 8B shape's final norm (what SpecForge's conversion reads)."""
    path = work / "model"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps({"hidden_size": HIDDEN, "rms_norm_eps": 1e-5}))
    save_file({"model.norm.weight": torch.rand(HIDDEN).to(torch.bfloat16) + 0.5}, str(path / "model.safetensors"))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        header, src, entry = fp8_sample(work, args.tokens)
        cases = {
            "speculators": bf16_conversion(header),
            "specforge": bf16_conversion(header, "specforge", model_dir(work)),
        }
        best: dict[str, float] = {}
        for _ in range(args.repeats):  # the cases alternate, so the machine's drift falls on both
            for name, conversion in cases.items():
                dest = work / f"out-{name}"
                t0 = time.perf_counter()
                # what collect and pull do for a sample after checking its FP8 file (not timed here)
                converted, why = conversion.verified(src, dest, entry)
                took = time.perf_counter() - t0
                if converted is None:
                    raise SystemExit(f"{name}: {why}")
                best[name] = min(best.get(name, took), took)
        fp8_gb = src.stat().st_size / 1e9
        out = {name: round(fp8_gb / s, 3) for name, s in best.items()}
        print(f"FP8 file {src.stat().st_size / 2**20:.1f} MiB ({args.tokens} tokens x {SLOTS} x {HIDDEN}), one thread")
        for name, rate in out.items():
            print(f"  to bf16 {name:12s} {rate:6.3f} GB/s of FP8 read ({best[name] * 1000:.0f} ms a sample)")
        print(f"specforge / speculators: {out['specforge'] / out['speculators']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
