"""How far transformers' own bfloat16 forward pass lies from its float32 one, on the 8B-shaped
random-weight model: the yardstick for the capture's distance from float32 transformers.

The pipeline check compares a few captured samples with float32 transformers (`pipeline_gpu.py`,
``compare_with_transformers``). SGLang runs the model in bfloat16, so the captured rows carry
bf16's rounding, and through 32 random-weight layers that grows with depth. This measures the same
prompts (the pipeline check's dataset, same seed, its first samples of at most 2,048 tokens) through
transformers in float32 and then in bfloat16, at the layers the capture takes, with the bounds'
own measures (``tests/support/hf_reference.py``): the relative L2 error of the whole prompt, the
median over tokens, and the error against the neighbouring layers.

    python3 bench/gpu/bf16_drift.py --bundle .gpu [--samples 2]

Prints one JSON line (and writes ``bf16_drift.json`` into ``$OUT`` where set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO / "bench"), str(REPO / "files" / "python"), str(REPO / "tests")]

import gpu_env  # noqa: E402

LAYERS = (2, 16, 29)  # SGLang's layers_to_capture for 32 layers (the EAGLE-3 default)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=REPO / ".gpu")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/hsx-pipeline"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    env = gpu_env.install(args.bundle, Path("/tmp/hsx-gpu-site"), args.work / "install.log")

    import capture_server_gpu
    import pipeline_gpu
    import torch
    from support.hf_reference import median_token_err, reference, rel_err
    from transformers import AutoModelForCausalLM

    model = capture_server_gpu.prepare_model(env, args.work, 0)
    dataset = args.work / "llama8b-drift-data.jsonl"
    pipeline_gpu.write_dataset(dataset, 200, 32768, "w", seed=0)  # the pipeline check's 200-sample set
    prompts = [p for p in pipeline_gpu.encode(dataset, model, 32768 - 16) if len(p) <= 2048][: args.samples]
    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).to("cuda").eval()
    fp32 = [reference(model, ids, model=hf) for ids in prompts]
    hf = hf.to(torch.bfloat16)
    bf16 = [reference(model, ids, model=hf) for ids in prompts]
    result: dict = {
        "benchmark": "bf16_drift",
        "model": "8B-shaped Llama, random weights (gen_llama8b.py)",
        "tokens": [len(p) for p in prompts],
        "layers": {},
    }
    for layer in LAYERS:
        rows = []
        for a, b in zip(bf16, fp32, strict=True):
            got, want = a.hidden_states[layer], b.hidden_states[layer]
            rows.append(
                {
                    "rel_err": round(rel_err(got, want), 4),
                    "median_token": round(median_token_err(got, want), 4),
                    "vs_neighbours": [round(rel_err(got, b.hidden_states[o]), 4) for o in (layer - 1, layer + 1)],
                }
            )
        result["layers"][str(layer)] = rows
    result["layers"]["final_post_norm"] = [
        {
            "rel_err": round(rel_err(a.post_norm, b.post_norm), 4),
            "median_token": round(median_token_err(a.post_norm, b.post_norm), 4),
        }
        for a, b in zip(bf16, fp32, strict=True)
    ]
    line = json.dumps(result)
    print(line)
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "bf16_drift.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
