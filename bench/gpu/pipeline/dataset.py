"""The generated dataset: conversations of realistic varied lengths, and their ids as the client
itself encodes them (what the plain loop sends must be what the product sends)."""

from __future__ import annotations

import json
import random
from pathlib import Path

_TEXT = (
    "the capital city of france is paris hello world this is a tiny test model for sglang deep learning "
    "models produce hidden states at every layer we dump auxiliary during prefill to shared memory quick "
    "brown fox jumps over lazy dog user asks question and assistant answers it politely"
)
_ENGLISH = _TEXT.split()


def write_dataset(
    path: Path, n: int, context: int, words: str, seed: int = 0, mean_words: int = 120, long_prompts: bool = True
) -> dict:
    """``n`` conversations (1-3 turns) of varied lengths, with a share of long ones unless
    ``long_prompts`` is false; returns what was made (word counts)."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(100, 120_000)] if words == "w" else _ENGLISH
    budget = context - 64  # the chat template's tokens and the reply's

    def message(k: int) -> str:
        return " ".join(rng.choice(vocab) for _ in range(max(1, k)))

    lengths = []
    with path.open("w") as f:
        for i in range(n):
            turns = 1 + rng.randrange(3)
            sizes = [int(rng.expovariate(1 / mean_words)) + 2 for _ in range(2 * turns)]
            if long_prompts and i % 20 == 7:  # long: several chunks of the prefill
                sizes[0] = rng.randint(min(2_000, budget // 4), min(8_000, budget // 2))
            if i in (3, 11, 19) and budget >= 20_000:  # near the context
                sizes[0] = rng.randint(16_000, min(30_000, budget - sum(sizes[1:]) - 200))
            while sum(sizes) > budget - 20 * len(sizes):
                sizes[sizes.index(max(sizes))] //= 2
            msgs = [{"role": "user" if j % 2 == 0 else "assistant", "content": message(k)} for j, k in enumerate(sizes)]
            f.write(json.dumps({"messages": msgs}) + "\n")
            lengths.append(sum(sizes))
    lengths.sort()
    return {
        "samples": n,
        "words_total": sum(lengths),
        "words_min": lengths[0],
        "words_median": lengths[n // 2],
        "words_max": lengths[-1],
        "over_4096": sum(x > 4096 for x in lengths),
        "over_16000": sum(x > 16000 for x in lengths),
    }


def encode(dataset: Path, model: Path, max_tokens: int) -> list[list[int]]:
    """Every sample's ids, as the client's own encoder makes them (the samples it rejects, as too
    long for instance, are not sent by the client either)."""
    from hsextract.dataset.chat_template import Encoded, build_encoder
    from hsextract.dataset.reader import Reject, read_dataset

    encoder = build_encoder(model, None, max_tokens, "truncate")
    out = []
    for item in read_dataset(dataset):
        enc = item if isinstance(item, Reject) else encoder.encode(item)
        if isinstance(enc, Encoded):
            out.append(enc.input_ids)
    return out
