"""From a dataset scan to the run's cost: training-set bytes per format, staging, time, room.

Sample files are sized exactly by each format's own layout (`OutputFormat.sample_file_bytes`:
the safetensors header, or the ``torch.save`` zip with its alignment and pickle), from the
tokens and the model's hidden size, aux layer count and dtype; in FP8 too, for a format whose
reader reads FP8 rows (one byte an element, four a token for its scale, and the header). The
bookkeeping beside them (the manifest lines, each format's dataset-level files as its registry
entry sizes them, the draft vocabulary files) is estimated.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.formats import FORMAT_NAMES, FORMATS, get_format
from hsextract.plan.report import FormatBytes, bytes_key

MANIFEST_LINE_BYTES = 260  # one manifest.jsonl line: indices, rid, tokens, file, bytes, checksum, time


@dataclass(frozen=True)
class Layout:
    """What a sample file's size depends on besides its tokens."""

    num_aux: int
    hidden_size: int
    dtype: Any  # torch.dtype


def sample_bytes(fmt_name: str, shapes: Counter, layout: Layout) -> int:
    """Exact bytes of the sample files of every (tokens, index class) in `shapes`, in format `fmt_name`."""
    from hsextract.formats.base import SampleShape  # with the writers: torch

    fmt = get_format(fmt_name)
    total = 0
    for (tokens, index), n in shapes.items():
        shape = SampleShape(tokens, layout.num_aux, layout.hidden_size, layout.dtype, index)
        total += n * fmt.sample_file_bytes(shape)
    return total


def bookkeeping_bytes(fmt_name: str, samples: int, tokens: int, vocab_size: int, draft_sizes: list[int]) -> int:
    """An estimate of everything else the output directory holds for these samples."""
    n = samples * MANIFEST_LINE_BYTES + (64 << 10)  # + manifest.json, state files
    spec = FORMATS[fmt_name]  # its dataset-level files
    n += samples * spec.dataset_bytes_per_sample + tokens * spec.dataset_bytes_per_token
    # token_freq, and per size: SpecForge's and speculators' d2t + t2d, ModelOpt's d2t (first size twice)
    n += 24 * min(tokens, vocab_size or tokens)
    for i, requested in enumerate(draft_sizes):
        copies = 2 if i == 0 else 1
        size = min(requested, vocab_size) if vocab_size else requested
        n += copies * (3 * 8 * size + 2 * vocab_size + 1024)
    return n


def per_format_bytes(
    shapes: Counter,
    pending: Counter,
    samples: int,
    tokens: int,
    pending_samples: int,
    pending_tokens: int,
    layout: Layout,
    vocab_size: int,
    draft_sizes: list[int],
) -> dict[str, FormatBytes]:
    """Every format's bytes in each precision its reader reads, in the registry's order (keyed by
    `hsextract.plan.report.bytes_key`)."""
    from hsextract import fp8

    out = {}
    for name, precision in ((n, p) for n in FORMAT_NAMES for p in FORMATS[n].precisions):
        stored = layout if precision == "bf16" else Layout(layout.num_aux, layout.hidden_size, fp8.DTYPE)
        files = sample_bytes(name, shapes, stored)
        rest = bookkeeping_bytes(name, samples, tokens, vocab_size, draft_sizes)
        left = sample_bytes(name, pending, stored) if pending != shapes else files
        out[bytes_key(name, precision)] = FormatBytes(
            sample_bytes=files,
            bookkeeping_bytes_estimate=rest,
            total_bytes=files + rest,
            remaining_bytes=left + bookkeeping_bytes(name, pending_samples, pending_tokens, vocab_size, draft_sizes),
        )
    return out


def bench_rate(results_dir: Path | None, num_hidden_layers: int) -> tuple[float, str] | None:
    """Prefill tokens/s with the capture on, from the GPU bench, scaled to the model's depth; None if absent.

    The bench runs a stand-in prefill (dense layers at Kimi-K2.5 width on one H200); a model
    with more layers runs proportionally fewer tokens per second. Measure your host and pass
    --tokens-per-s for a figure that is more than an estimate.
    """
    if results_dir is None:
        return None
    p = Path(results_dir) / "capture_overhead.json"
    try:
        data = json.loads(p.read_text())
        rate, layers = float(data["capture_tok_s"]), int(data["layers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    scaled = rate * layers / max(1, num_hidden_layers)
    source = (
        f"{p.name}: {rate:,.0f} tokens/s with the capture on ({layers} dense layers at hidden "
        f"{data.get('hidden', '?')} on {data.get('device', 'a GPU')}), scaled to {num_hidden_layers} layers; "
        "an estimate: pass --tokens-per-s with your host's rate"
    )
    return scaled, source


def default_results_dir() -> Path | None:
    """The repository's bench/results, when the package runs from a checkout."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "bench" / "results"
        if candidate.is_dir():
            return candidate
    return None
