"""Staged dumps with chosen token ids and loss masks, and what their draft vocabulary must be.

The expected counts and selections are computed here from the staged ids and masks alone, by
the rule the trainers document (count descending, then id ascending, padded with the lowest
uncounted ids), independently of hsextract.vocab.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import torch
from hsextract import fingerprint
from hsextract.staging.dumps import DoneMarker, write_done_marker
from hsextract.staging.records import SampleRecord, make_rid, write_record
from support.staged_dumps import write_states

VOCAB = 500
EAGLE = [1, 3, 4]


def stage(dump: Path, run_id: str, index: int, ids: list[int], mask: list[int], hidden: int = 16) -> None:
    rid = make_rid("hsx", run_id, index)
    t = len(ids)
    write_record(dump, SampleRecord(rid=rid, index=index, input_ids=ids, loss_mask=mask, run_id=run_id))
    d = dump / rid
    d.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(index)
    rows = torch.randn(t, len(EAGLE) + 1, hidden, generator=g).bfloat16()
    write_states(d / "states.safetensors", rows, torch.tensor(ids, dtype=torch.int64))
    write_done_marker(
        dump,
        DoneMarker(
            rid=rid,
            prompt_len=t,
            num_aux=len(EAGLE),
            hidden_size=hidden,
            dtype="bfloat16",
            eagle_aux_hidden_state_layer_ids=EAGLE,
            sglang_layers_to_capture=[i + 1 for i in EAGLE],
            num_hidden_layers=8,
            final_hidden="post_norm",
            architecture="LlamaForCausalLM",
            chunks=[[0, t]],
            model_path="tiny",
            sglang_version="0.5.23",
            fingerprint=fingerprint.of_states(rows, torch.tensor(ids, dtype=torch.int64)),
        ),
    )


def make_samples(n: int, seed: int) -> dict[int, tuple[list[int], list[int]]]:
    """n samples of 4-40 tokens: a skewed id distribution (so counts tie and differ), masks half 1."""
    rng = random.Random(seed)
    weights = [1.0 / (1 + i) for i in range(VOCAB // 2)]  # only the lower half of the vocabulary occurs
    out = {}
    for i in range(n):
        t = rng.randint(4, 40)
        ids = rng.choices(range(VOCAB // 2), weights=weights, k=t)
        mask = [int(rng.random() < 0.5) for _ in range(t)]
        mask[-1] = 1
        out[i] = (ids, mask)
    return out


def stage_all(dump: Path, run_id: str, samples: dict[int, tuple[list[int], list[int]]], fmt: str) -> None:
    for i, (ids, mask) in samples.items():
        stage(dump, run_id, i, ids, mask)
        if fmt in ("speculators", "speculators-v1"):
            marker = dump / make_rid("hsx", run_id, i) / "done.json"
            marker.write_text(marker.read_text().replace('"post_norm"', '"pre_norm"'))


def expected_counts(samples, indices=None) -> Counter:
    c: Counter = Counter()
    for i in samples if indices is None else indices:
        ids, mask = samples[i]
        c.update(t for t, m in zip(ids, mask, strict=True) if m == 1)
    return c


def expected_selection(counts: Counter, n: int) -> list[int]:
    """The draft vocabulary's ids in frequency order, then the padding."""
    top = sorted(counts, key=lambda t: (-counts[t], t))[:n]
    pad = [t for t in range(n) if t not in set(top)][: n - len(top)]
    return top + pad
