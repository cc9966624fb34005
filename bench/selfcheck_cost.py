"""What the drain's self-check costs per sample (the greedy check alone, and with the logprob check
of 64 prompt positions in the same pass over the head), and what the fingerprint costs the drain
and the capture's writer, on this machine's CPU.

Run it on the machine that runs the drain: the head is read from its disk or page cache.

The self-check reads the model's whole ``lm_head`` for each checked sample, in chunks (never whole
in memory). This bench writes a random head of a real model's shape (default: Kimi-K2.5 /
DeepSeek-V3, 163,840 x 7,168 in bf16, 2.3 GB) and times `GreedyHead.check` with the file's pages
cold (dropped from the page cache) and warm, the same with the logprob check of a 64-position
prompt (`hsextract.logprob_check.check_final_rows`: the server's top 5 and next token at each
position; the values compared are made up, the work is the same), and the process's peak memory
beside the head's size.
It times one pass over the head for 1, 8 and 32 samples (the drain's check queue takes every
sample waiting into one pass: `GreedyHead.check_many`), on one thread and on two. It also times
the fingerprint of a staged sample (`hsextract.fingerprint.of_states`) against a plain read of the
same bytes, which is what the drain adds per sample and the writer per row.

    python bench/selfcheck_cost.py [--vocab 163840 --hidden 7168] [--json bench/results/selfcheck_cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "bench")]

import torch  # noqa: E402
from common import machine_info  # noqa: E402
from hsextract import fingerprint  # noqa: E402
from hsextract.greedy_check import GreedyHead, HeadQuery  # noqa: E402
from hsextract.logprob_check import check_final_rows  # noqa: E402
from hsextract.server_logprobs import DEFAULT_MAX_POSITIONS, DEFAULT_TOP_K, ServerLogprobs  # noqa: E402


def write_head(model: Path, vocab: int, hidden: int) -> None:
    """A model directory with only what the check reads: config, lm_head, final norm."""
    from safetensors.torch import save_file

    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(
        json.dumps({"hidden_size": hidden, "vocab_size": vocab, "rms_norm_eps": 1e-6, "tie_word_embeddings": False})
    )
    g = torch.Generator().manual_seed(0)
    head = torch.empty(vocab, hidden, dtype=torch.bfloat16)
    for a in range(0, vocab, 16384):  # filled in pieces: a float32 randn of the whole head would be 4.7 GB
        b = min(a + 16384, vocab)
        head[a:b] = (torch.randn(b - a, hidden, generator=g) * 0.02).to(torch.bfloat16)
    save_file(
        {"lm_head.weight": head, "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)},
        str(model / "model.safetensors"),
    )


def drop_page_cache(path: Path) -> None:
    """Evict one file's pages (POSIX_FADV_DONTNEED): the next read comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def time_checks(model: Path, hidden: int, repeats: int) -> dict:
    head = GreedyHead(model)
    h = torch.randn(hidden).to(torch.bfloat16)
    token = 17
    drop_page_cache(head.head_file)
    t0 = time.perf_counter()
    head.check(h, "pre_norm", token)
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        head.check(h, "pre_norm", token)
        warm.append(time.perf_counter() - t0)
    warm.sort()
    rows = torch.randn(DEFAULT_MAX_POSITIONS, hidden).to(torch.bfloat16)
    server = made_up_logprobs(DEFAULT_MAX_POSITIONS, head)
    both = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        check_final_rows(head, rows, "pre_norm", token, server)
        both.append(time.perf_counter() - t0)
    both.sort()
    return {
        "cold_s": round(cold, 3),
        "warm_s_median": round(warm[len(warm) // 2], 3),
        "warm_s_min": round(warm[0], 3),
        "with_logprobs_warm_s_median": round(both[len(both) // 2], 3),
        "logprob_positions": DEFAULT_MAX_POSITIONS,
        # One pass for several samples (the drain's check queue), on one thread and on two.
        "pass_s_median_by_samples": {
            f"{n} x {threads} threads": time_pass(model, hidden, n, threads, repeats)
            for threads in (1, 2)
            for n in (1, 8, 32)
        },
    }


def time_pass(model: Path, hidden: int, samples: int, threads: int, repeats: int) -> float:
    """The median seconds of one pass over the head for `samples` samples' last rows."""
    head = GreedyHead(model, threads=threads)
    queries = [HeadQuery(torch.randn(1, hidden).to(torch.bfloat16), "pre_norm", 17) for _ in range(samples)]
    took = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        head.check_many(queries)
        took.append(time.perf_counter() - t0)
    head.close()
    took.sort()
    return round(took[len(took) // 2], 3)


def made_up_logprobs(positions: int, head: GreedyHead) -> ServerLogprobs:
    """A server's answer of the right shape for ``positions`` positions (ids spread over the head)."""
    g = torch.Generator().manual_seed(1)
    vocab = head.vocab
    ids = torch.randint(0, vocab, (positions, DEFAULT_TOP_K + 1), generator=g).tolist()
    return ServerLogprobs(
        [i[:-1] for i in ids], [[-1.0] * DEFAULT_TOP_K for _ in ids], [i[-1] for i in ids], [-2.0] * positions
    )


def time_fingerprint(tokens: int, slots: int, hidden: int, repeats: int) -> dict:
    rows = (torch.randn(tokens, slots, hidden) * 0.5).to(torch.bfloat16)
    ids = torch.randint(0, 100_000, (tokens,))
    nbytes = rows.numel() * 2
    fp, copy = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fingerprint.of_states(rows, ids)
        fp.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rows.clone()
        copy.append(time.perf_counter() - t0)
    fp.sort()
    copy.sort()
    return {
        "sample_mb": round(nbytes / 1e6, 1),
        "fingerprint_gb_per_s": round(nbytes / 1e9 / fp[len(fp) // 2], 2),
        "memory_copy_gb_per_s": round(nbytes / 1e9 / copy[len(copy) // 2], 2),
        "fingerprint_over_copy_time": round(fp[len(fp) // 2] / copy[len(copy) // 2], 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=163_840)
    ap.add_argument("--hidden", type=int, default=7_168)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--work", type=Path, default=None, help="where the head is written (default: a temporary dir)")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "selfcheck_cost.json")
    ap.add_argument("--check-only", type=Path, help=argparse.SUPPRESS)  # the measured child process
    args = ap.parse_args()
    torch.set_num_threads(1)  # as one of the drain's workers
    if args.check_only:
        checks = time_checks(args.check_only, args.hidden, args.repeats)
        checks["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)
        print(json.dumps(checks))
        return 0
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        model = Path(tmp) / "model"
        write_head(model, args.vocab, args.hidden)
        head_gb = (model / "model.safetensors").stat().st_size / 1e9
        # In a process of its own, so that its peak memory is the check's, not the head's writer's.
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--check-only",
                str(model),
                "--hidden",
                str(args.hidden),
                "--repeats",
                str(args.repeats),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        checks = json.loads(child.stdout.strip().splitlines()[-1])
    result = {
        "benchmark": "selfcheck_cost",
        "what": "the drain's greedy self-check of one sample (lm_head read in 64 MiB chunks, one thread), with the "
        "logprob check of 64 positions in the same pass, one pass for several samples on one and two threads, "
        "and the fingerprint of a staged sample against a plain copy of its bytes",
        "head": {"vocab": args.vocab, "hidden": args.hidden, "gb": round(head_gb, 2)},
        "selfcheck": checks,
        "fingerprint": time_fingerprint(2048, 4, args.hidden, args.repeats),
        "machine": machine_info(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
