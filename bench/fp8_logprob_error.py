"""How far FP8 rows move the logprob self-check on a real model, against a one-layer offset.

The logprob check (hsextract.logprob_check) rebuilds the server's prompt logprobs from a sample's
final rows and fails it above a mean absolute error bound. Its bound for FP8 rows was set on the
suite's random-weight tiny models; a trained model's residual stream (outlier channels, confident
distributions) may move it further. This runs a real model through the real SGLang server on the
CPU, the capture staging pre-norm rows (the speculators format's placement), and for each prompt
compares, side by side on the same prompt and the same server logprobs:

* the captured bf16 rows;
* the same rows through FP8 (one scale per token over all its rows, dequantized as the trainer reads);
* the layer before instead of the final state (transformers' float32 rows of that layer), in bf16
  and through FP8: the one-layer offset the check must fail.

Prints each case's mean error over the prompts (lowest, median, highest) and how many exceed the
given bound; ``--json`` keeps them.

    python bench/fp8_logprob_error.py --model DIR [--prompts ../shared/data/gsm8k/test.jsonl] [--n 12]
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "tests")]

import torch  # noqa: E402
from hsextract import fp8, server_logprobs  # noqa: E402
from hsextract.greedy_check import FP8_REL_TIE, GreedyHead  # noqa: E402
from hsextract.logprob_check import check_final_rows  # noqa: E402
from hsextract.server_logprobs import DEFAULT_MAX_MEAN_ABS_ERROR  # noqa: E402
from hsextract.staging.dumps import read_states  # noqa: E402
from support.hf_reference import reference  # noqa: E402
from support.server_dumps import wait_done  # noqa: E402
from support.sglang_server import free_port, start_server  # noqa: E402


def prompts(path: Path, n: int, model: Path) -> list[list[int]]:
    """The first `n` questions of a GSM8K-style JSONL file, through the model's chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    out = []
    for line in path.read_text().splitlines()[:n]:
        question = json.loads(line)["question"]
        ids = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def through_fp8(rows: torch.Tensor) -> torch.Tensor:
    """The final rows the trainer reads of `rows` stored as FP8."""
    return fp8.dequantize(*fp8.quantize(rows))[:, -1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, default=REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl")
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--bound", type=float, default=DEFAULT_MAX_MEAN_ABS_ERROR)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--name", default="", help="the model's name in the output (default: its directory's)")
    args = ap.parse_args()
    head = GreedyHead(args.model)
    cases: dict[str, list[float]] = {"bf16": [], "fp8": [], "layer_before_bf16": [], "layer_before_fp8": []}
    largest: dict[str, float] = dict.fromkeys(cases, 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        server = start_server(
            args.model,
            port=free_port(31000, 32000),
            dump_dir=base / "dump",
            log_dir=base / "logs",
            final_hidden="pre_norm",
            chunked_prefill_size=512,
        )
        try:
            for ids in prompts(args.prompts, args.n, args.model):
                rid = f"{server.rid_prefix}-{secrets.token_hex(4)}-0"
                token = server.generate(ids, rid=rid)["output_ids"][0]
                d = wait_done(server.dump_dir, rid)
                rows = read_states(d).hidden.clone()
                shutil.rmtree(d, ignore_errors=True)
                given = server_logprobs.fetch(server.url, ids)
                offset = rows.clone()
                offset[:, -1] = reference(args.model, ids).hidden_states[-2].bfloat16()
                finals = {
                    "bf16": (rows[:, -1], None),
                    "fp8": (through_fp8(rows), FP8_REL_TIE),
                    "layer_before_bf16": (offset[:, -1], None),
                    "layer_before_fp8": (through_fp8(offset), FP8_REL_TIE),
                }
                for name, (final, tie) in finals.items():
                    kw = {"tie": tie} if tie else {}
                    _, lp = check_final_rows(head, final, "pre_norm", token, given, **kw)
                    cases[name].append(lp.mean_abs_error)
                    largest[name] = max(largest[name], lp.max_abs_error)
                print(f"{len(ids):5d} tokens: " + "  ".join(f"{k} {v[-1]:.4f}" for k, v in cases.items()), flush=True)
        finally:
            server.stop()
    result = {
        name: {
            "mean_abs_error_lowest": round(min(v), 4),
            "median": round(statistics.median(v), 4),
            "highest": round(max(v), 4),
            "largest_single": round(largest[name], 4),
            "above_bound": sum(e > args.bound for e in v),
            "prompts": len(v),
        }
        for name, v in cases.items()
    }
    name = args.name or args.model.name
    print(f"model {name}, {args.n} prompts, bound {args.bound}")
    for name, r in result.items():
        print(
            f"  {name:18s} {r['mean_abs_error_lowest']:.4f} / {r['median']:.4f} / {r['highest']:.4f}  "
            f"above the bound: {r['above_bound']} of {r['prompts']}"
        )
    if args.json:
        args.json.write_text(json.dumps({"model": name, "bound": args.bound, **result}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
