"""The drafter bench's measure: each arm's drafter served by SGLang, its accept length on real prompts.

Every server serves the same target; the speculative ones with EAGLE-3 as a chain (3 steps, top-k 1,
4 draft tokens), the baseline without speculation, all with ``--disable-cuda-graph`` (the tier
carries no ``flash_mla``, which the draft's graph capture imports). Requests are greedy (the tier
carries no flashinfer for sampled decoding), 256 new tokens, with the target's chat template.

τ (the accept length) = Σ ``completion_tokens`` / Σ ``spec_verify_ct`` over ``/generate``'s
``meta_info``: the tokens each verify step of the target yields, 1.0 for a draft that is never
accepted. Greedy speculative decoding must give the target's own tokens, so each arm's texts are
compared with the baseline's. Decode throughput is measured per server alone (the others idle), on
the same prompts at the same concurrency.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

SPEC_FLAGS = (
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
)
MAX_NEW_TOKENS = 256


def encode_prompts(model: Path, prompts: list[dict]) -> list[list[int]]:
    """Each prompt as one user turn through the target's chat template, ready for the reply."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    out = []
    for p in prompts:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": p["prompt"]}], add_generation_prompt=True, tokenize=True
        )
        out.append([int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)])
    return out


def _post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


async def _generate_all(
    url: str, prompts: list[list[int]], concurrency: int, max_new_tokens: int, stop_at: list[float] | None
) -> tuple[list[dict | None], float]:
    sem = asyncio.Semaphore(concurrency)
    body = {"sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}

    async def one(k: int, ids: list[int]) -> dict | None:
        async with sem:
            if stop_at is not None and time.monotonic() > stop_at[k]:
                return None
            return await asyncio.to_thread(_post, url, {"input_ids": ids, **body})

    t0 = time.monotonic()
    results = await asyncio.gather(*(one(k, p) for k, p in enumerate(prompts)))
    return list(results), time.monotonic() - t0


def generate(
    url: str,
    prompts: list[list[int]],
    concurrency: int,
    max_new_tokens: int = MAX_NEW_TOKENS,
    stop_at: list[float] | None = None,
) -> tuple[list[dict | None], float]:
    """Every prompt's answer (in order) and the wall time, ``concurrency`` requests in flight, sent in
    order. With ``stop_at`` (a ``time.monotonic()`` per prompt), a prompt whose turn comes after its
    time is not sent and its answer is None: the run ends inside its budget with the prompts it had
    time for."""
    return asyncio.run(_generate_all(url, prompts, concurrency, max_new_tokens, stop_at))


def answered_by_all(answers: dict[str, list[dict | None]], idx: list[int]) -> list[int]:
    """The prompts of ``idx`` every server answered: the arms' τ and differences are taken on the same
    prompts, also when the budget cut some."""
    return [i for i in idx if all(a[i] is not None for a in answers.values())]


def accept_length(answers: list[dict]) -> dict:
    """τ over ``answers``, with the counts it is made of."""
    tokens = sum(a["meta_info"]["completion_tokens"] for a in answers)
    verify = sum(a["meta_info"].get("spec_verify_ct", 0) or 0 for a in answers)
    return {
        "tau": round(tokens / verify, 4) if verify else None,
        "completion_tokens": tokens,
        "verify_steps": verify,
        "requests": len(answers),
    }


def same_text_share(answers: list[dict], baseline: list[dict]) -> float:
    """The share of answers whose text equals the baseline server's (greedy: all, up to bf16 ties)."""
    same = sum(a["text"] == b["text"] for a, b in zip(answers, baseline, strict=True))
    return round(same / len(baseline), 4) if baseline else 0.0


def per_request(answers: list[dict]) -> list[list[int]]:
    """Each answer's (completion tokens, verify steps), kept for the spread of τ's differences."""
    return [[a["meta_info"]["completion_tokens"], a["meta_info"].get("spec_verify_ct", 0) or 0] for a in answers]


def paired_difference(a: list[list[int]], b: list[list[int]], rounds: int = 2000, seed: int = 0) -> dict:
    """τ(a) - τ(b) on the same prompts, with a 95 % interval from a paired bootstrap over the prompts
    (each round draws the prompts with replacement and takes both arms' counts of each)."""
    import random

    def tau(rows: list[list[int]], idx: list[int]) -> float:
        verify = sum(rows[i][1] for i in idx)
        return sum(rows[i][0] for i in idx) / verify if verify else float("nan")

    n = len(a)
    everything = list(range(n))
    rng = random.Random(seed)
    diffs = sorted(tau(a, s) - tau(b, s) for s in ([rng.randrange(n) for _ in range(n)] for _ in range(rounds)))
    return {
        "difference": round(tau(a, everything) - tau(b, everything), 4),
        "interval_95": [round(diffs[int(0.025 * rounds)], 4), round(diffs[int(0.975 * rounds) - 1], 4)],
    }


def correct_drafts_histogram(answers: list[dict]) -> list[int]:
    """The verify steps that accepted 0, 1, 2, ... draft tokens, summed over ``answers`` (SGLang's
    per-request ``spec_correct_drafts_histogram``; empty where the server sent none)."""
    total: list[int] = []
    for a in answers:
        for k, n in enumerate(a["meta_info"].get("spec_correct_drafts_histogram") or []):
            total.extend([0] * (k + 1 - len(total)))
            total[k] += int(n)
    return total


def lower(differences: dict, arm: str, name: str = "gsm8k") -> float | None:
    """The lower end of τ_A - τ_arm's 95 % interval, or None where the arm was not served."""
    got = differences.get(f"A-{arm}", {}).get(name)
    return got["interval_95"][0] if got else None


def criteria(tau: dict, differences: dict) -> dict:
    """The criteria fixed before the run of 2026-12-07 (GSM8K test, 95 % paired intervals), each with
    the figures it was judged on; an arm that was not served leaves its criteria None (not run)."""

    def at_least(arm: str, bound: float, strict: bool = False) -> dict:
        low = lower(differences, arm)
        met = None if low is None else (low > bound if strict else low >= bound)
        return {"lower_bound": low, "bound": bound, "met": met}

    def diff(arm: str) -> float | None:
        got = differences.get(f"A-{arm}", {}).get("gsm8k")
        return got["difference"] if got else None

    floor = at_least("floor", 0.5, strict=True)
    floor["difference"] = diff("floor")
    floor["met"] = None if floor["lower_bound"] is None else floor["met"] and floor["difference"] >= 0.5

    def within_noise(arm: str) -> dict | None:
        """`arm` as good as A: its paired interval within +-0.06, and its difference within A2's (a
        second seed of A: the training's own noise) plus 0.03."""
        got, aa2 = differences.get(f"A-{arm}", {}).get("gsm8k"), diff("A2")
        if not got or aa2 is None:
            return None
        inside = got["interval_95"][0] >= -0.06 and got["interval_95"][1] <= 0.06
        close = abs(got["difference"]) <= abs(aa2) + 0.03
        return {
            f"A-{arm}": got,
            "A-A2": aa2,
            "interval_within_0.06": inside,
            f"abs_A-{arm}_within_noise_plus_0.03": close,
            "met": inside and close,
        }

    return {
        "1_A_above_floor_by_0.5": floor,
        "2_states_carry_the_signal_A-D2": at_least("D2", 0.20),
        "3_off_by_one_capture_A-S1": at_least("S1", 0.30),
        "3_far_layers_at_serving_A-C_far": at_least("C_far", 0.30),
        "3_next_layers_at_serving_A-C": at_least("C", 0.0, strict=True),
        "4_rows_as_good_as_the_reference": within_noise("B"),
        "5_fp8_rows_as_good_as_bf16_A-F8": within_noise("F8"),
    }
