"""A sample longer than the limit is tokenized only as far as the limit needs: the same first tokens
as the whole text's, at a memory cost bounded by the row's size, not a few hundred times it."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap

import pytest
from hsextract.dataset.chat_template import Encoded, SampleEncoder, load_tokenizer
from hsextract.dataset.head_tokens import MIN_HEAD_CHARS, tokenize_head
from hsextract.dataset.reader import Reject, Sample
from support.client_run import WORDS, env


def _texts() -> dict[str, str]:
    rng = random.Random(7)
    words = " ".join(rng.choice(WORDS) for _ in range(60_000))
    punctuated = "".join(rng.choice([w + " ", w + ", ", w + ".\n", w + "!  ", "\t" + w]) for w in words.split())
    pieces = ["café ", "naïve ", "日本語 ", "🙂🙂 ", "x" * 40 + " ", "\n\n"]
    unicode = "".join(rng.choice(pieces) for _ in range(40_000))
    no_spaces = "".join(rng.choice(WORDS) for _ in range(30_000))  # one pre-tokenizer word of ~150K characters
    return {"words": words, "punctuated": punctuated, "unicode": unicode, "no_spaces": no_spaces}


@pytest.mark.parametrize("name", sorted(_texts()))
@pytest.mark.parametrize("limit", [1, 2047, 9000])
def test_the_head_of_a_long_text_is_the_first_tokens_of_the_whole_text(tiny_llama, name, limit):
    tok = load_tokenizer(tiny_llama)
    text = _texts()[name]
    assert len(text) > MIN_HEAD_CHARS
    whole = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    head = tokenize_head(tok, text, limit)
    assert head.more and len(head.ids) == limit + 1
    assert head.ids == whole["input_ids"][: limit + 1]
    assert head.starts == [s for s, _ in whole["offset_mapping"][: limit + 1]]


def test_a_text_within_the_limit_is_tokenized_whole(tiny_llama):
    tok = load_tokenizer(tiny_llama)
    text = _texts()["words"][: MIN_HEAD_CHARS * 3]
    whole = tok(text, add_special_tokens=False)["input_ids"]
    head = tokenize_head(tok, text, len(whole))
    assert not head.more and head.ids == whole


def test_a_long_sample_is_cut_or_skipped_as_the_whole_text_would_be(tiny_llama):
    tok = load_tokenizer(tiny_llama)
    messages = [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": _texts()["punctuated"]}]
    sample = Sample(3, messages=[_message(m) for m in messages])
    cut = SampleEncoder(tok, 2047, "truncate").encode(sample)
    full = SampleEncoder(tok, None).encode(sample)
    assert isinstance(cut, Encoded) and isinstance(full, Encoded)
    assert cut.input_ids == full.input_ids[:2047] and cut.loss_mask == full.loss_mask[:2047]
    assert cut.truncated_from > 2047
    skipped = SampleEncoder(tok, 2047, "skip").encode(sample)
    assert isinstance(skipped, Reject) and skipped.detail == "more than 2047 tokens > max 2047 (overlong=skip)"


def _message(m: dict):
    from hsextract.dataset.reader import Message

    return Message(m["role"], m["content"])


PEAK = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    from hsextract.dataset.chat_template import build_encoder
    from hsextract.dataset.reader import DatasetReader, read_dataset
    encoder = build_encoder(Path(sys.argv[2]), None, None, "truncate", quiet=True)
    encoder.encode(next(iter(read_dataset(sys.argv[3], DatasetReader()))))  # the libraries' own first use
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcome = [type(encoder.encode(item)).__name__ for item in read_dataset(sys.argv[1], DatasetReader())]
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"outcome": outcome, "kb": after - before}))
""")


def test_a_row_just_under_the_row_limit_costs_memory_bounded_by_its_size(tiny_llama, tmp_path):
    """The row of D27: 8 MB of text under the default 8 MiB row limit took 2.9 GB to tokenize whole."""
    row = json.dumps(
        {"messages": [{"role": "user", "content": "word " * 1_600_000}, {"role": "assistant", "content": "short"}]}
    )
    (tmp_path / "big.jsonl").write_text(row + "\n")
    (tmp_path / "small.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}) + "\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", PEAK, str(tmp_path / "big.jsonl"), str(tiny_llama), str(tmp_path / "small.jsonl")],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["outcome"] == ["Reject"], "no reply token within the limit: a reject, as before"
    assert got["kb"] * 1024 < 30 * len(row), f"{got['kb']} KB of peak memory for a {len(row)}-byte row"
