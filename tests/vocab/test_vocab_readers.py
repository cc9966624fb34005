"""Every trainer loads the draft vocabulary files with its own code, and builds the same mapping.

Each peer runs in a subprocess with its own reader install (requirements/readers.txt; the process
that also loads that peer's samples, `support.reader_check`), over an output directory in the format
that peer trains on. Where the trainer can build the mapping itself (SpecForge from token counts,
speculators from token_freq.pt) its result must equal the files; where it counts the training set
itself (SpecForge's offline features, speculators' Arrow dataset) its counts must equal token_freq.
The ids are also checked against the expected selection computed from the staged tokens alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hsextract.output.run_id import load_or_create_run_id
from support.drain_proc import drain_until_done
from support.reader_check import load_vocab_with_reader
from vocab.vocab_data import VOCAB, expected_counts, expected_selection, make_samples, stage_all

pytestmark = [pytest.mark.slow, pytest.mark.readers, pytest.mark.timeout(900)]

SIZES = [16, 64]


def _load(readers: Path, peer: str, out: Path, suffix: str, model: Path) -> dict:
    loaded = load_vocab_with_reader(readers, peer, out, SIZES, VOCAB, suffix, model)
    assert loaded["modules"] == [], "a reader pulled in sglang or vllm"
    return loaded


@pytest.fixture(scope="module")
def verifier(tmp_path_factory) -> Path:
    """A model directory whose config.json says the vocabulary size (speculators reads it from there)."""
    from transformers import LlamaConfig

    path = tmp_path_factory.mktemp("verifier")
    LlamaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=8, num_attention_heads=2).save_pretrained(path)
    return path


@pytest.mark.parametrize("peer", ["specforge", "speculators", "speculators-v1", "modelopt"])
def test_each_trainer_loads_its_draft_vocabulary_with_its_own_code(peer, readers, verifier, tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out"
    samples = make_samples(40, seed=hash(peer) % 100)
    stage_all(dump, load_or_create_run_id(out), samples, peer)
    drain_until_done(dump, out, peer, "--draft-vocab-size", *map(str, SIZES), "--vocab-size", str(VOCAB), lines=40)
    suffix = ".pth" if peer in ("speculators-v1", "modelopt") else ".pt"
    loaded = _load(readers, peer, out, suffix, verifier)
    counts = expected_counts(samples)
    maps = loaded["mappings"]

    def assert_sorted_mapping(m: dict, n: int) -> None:
        ids = sorted(expected_selection(counts, n))
        assert m["d2t"].dtype == torch.int64 and (m["d2t"] + torch.arange(n)).tolist() == ids
        assert m["t2d"].dtype == torch.bool and m["t2d"].shape == (VOCAB,)
        assert torch.nonzero(m["t2d"]).flatten().tolist() == ids

    if peer == "specforge":
        for n in SIZES:
            assert_sorted_mapping(maps[f"vocab_mapping/vocab_mapping-{n}.pt"], n)
            ref = maps[f"reference-{n}"]  # SpecForge's process_token_dict_to_mappings over token_freq
            assert torch.equal(ref["d2t"], maps[f"vocab_mapping/vocab_mapping-{n}.pt"]["d2t"])
            assert torch.equal(ref["t2d"], maps[f"vocab_mapping/vocab_mapping-{n}.pt"]["t2d"])
        assert_sorted_mapping(maps["vocab_mapping/vocab_mapping.pt"], SIZES[0])
        assert loaded["recount"] == dict(counts)  # SpecForge's count_effective_feature_tokens
    elif peer == "speculators":
        for n in SIZES:
            assert_sorted_mapping(maps[f"d2t-{n}.npy"], n)
            ref = maps[f"reference-{n}"]  # speculators built it from token_freq.pt itself
            assert torch.equal(ref["d2t"], maps[f"d2t-{n}.npy"]["d2t"])
            assert torch.equal(ref["t2d"], maps[f"d2t-{n}.npy"]["t2d"])
        assert_sorted_mapping(maps["d2t.npy"], SIZES[0])
        assert loaded["recount"] == dict(counts)  # save_token_frequency_distribution over the Arrow dataset
    elif peer == "speculators-v1":
        assert_sorted_mapping(maps["d2t.npy"], SIZES[0])
    else:
        for n in SIZES:
            d2t = maps[f"draft_vocab_cache/d2t-{n}.pth"]["d2t"]
            assert d2t.dtype == torch.int64 and (d2t + torch.arange(n)).tolist() == expected_selection(counts, n)
        first = maps[f"draft_vocab_cache/d2t-{SIZES[0]}.pth"]["d2t"]
        assert torch.equal(maps["draft_vocab_cache/d2t.pth"]["d2t"], first)
