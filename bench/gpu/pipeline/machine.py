"""The machine's own numbers, measured beside the rounds: the output disk's sequential speed and its
ceiling for the drain's write pattern, a sample's bytes per token, and the client's tokenizer
phase taken apart. They say whether a pipeline figure was bound by the GPU, the disk or start-up."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import gpu_env

from .processes import product_env

_TOKENIZER_PHASES = """
import json, sys, time
t0 = time.monotonic()
from hsextract.dataset.chat_template import load_tokenizer
tok = load_tokenizer(sys.argv[1])
t1 = time.monotonic()
import torch
t2 = time.monotonic()
from transformers import AutoTokenizer
t3 = time.monotonic()
auto = AutoTokenizer.from_pretrained(sys.argv[1])
t4 = time.monotonic()
print(json.dumps({"client_load_tokenizer_s": round(t1 - t0, 2), "client_tokenizer_class": type(tok).__name__,
                  "import_torch_s": round(t2 - t1, 2), "import_transformers_s": round(t3 - t2, 2),
                  "auto_from_pretrained_s": round(t4 - t3, 2), "same_len": len(tok) == len(auto)}))
"""


def tokenizer_load(env: gpu_env.GpuEnv, model: Path) -> dict:
    """The client's tokenizer phase in the product's environment beside the running servers (its
    own path, in a fresh process first), then transformers' path taken apart: torch's import
    (transformers imports it), transformers' own, and ``AutoTokenizer``'s load."""
    done = subprocess.run(
        [sys.executable, "-c", _TOKENIZER_PHASES, str(model)],
        env=product_env(env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": done.stderr[-1000:]}


def ceiling_sizes(prompts: list[list[int]], bytes_per_token: int) -> list[int]:
    """File sizes for the disk's ceiling: the run's samples at their length quantiles (10 to 90 %)."""
    lengths = sorted(len(p) for p in prompts) or [1]
    picks = {lengths[min(len(lengths) - 1, k * len(lengths) // 10)] for k in range(1, 10)}
    return sorted(max(64 << 10, t * bytes_per_token) for t in picks)


def disk_ceiling(directory: Path, sizes: list[int], seconds: float = 4.0) -> dict:
    """The output disk's ceiling for the drain's write pattern (hsextract.ops.disk_ceiling)."""
    from hsextract.ops.disk_ceiling import measure

    return measure(directory, sizes, seconds_per_point=seconds).as_dict()


def sample_bytes_per_token(model: Path, num_aux: int = 3) -> int:
    """A training sample's bytes per token: K + 1 bf16 rows of the model's width, its id and mask."""
    from hsextract.model_info import read_model_info

    return (num_aux + 1) * read_model_info(model).hidden_size * 2 + 16


def disk_speed(directory: Path, gb: float = 2.0) -> dict:
    """The output disk's own sequential write speed (dd, fsync at the end)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "dd.bin"
    t0 = time.monotonic()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=16M", f"count={int(gb * 1e9 / (16 << 20))}", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    wall = time.monotonic() - t0
    nbytes = target.stat().st_size
    target.unlink()
    return {"gb": round(nbytes / 1e9, 2), "gb_per_s": round(nbytes / 1e9 / wall, 3)}
