"""The rows compared: a run's samples against another run's, sample by sample (the overlap
scheduler's against the no-overlap server's), and a few against float32 transformers with the
CPU tests' bounds. The drain checks each sample's integrity; these check the numbers themselves."""

from __future__ import annotations

from pathlib import Path


def load_rows(out: Path) -> dict[int, Path]:
    """Each sample's file in a set, by its index in the dataset (the key both runs share)."""
    from hsextract.output.manifest import iter_entries

    return {e.dataset_index: out / e.file for e in iter_entries(out)}


def load_sample(path: Path, device: str = "cpu"):
    """(ids, rows [T, K + 1, H]) of one SpecForge sample file."""
    import torch

    t = torch.load(path, map_location=device, weights_only=True)
    aux, final = t["aux_hidden_state"][0], t["hidden_state"][0]
    k = aux.shape[1] // final.shape[1]
    rows = torch.cat([aux.view(aux.shape[0], k, -1), final.view(final.shape[0], 1, -1)], dim=1)
    return t["input_ids"], rows


def compare_runs(a: Path, b: Path) -> dict:
    """Sample by sample, the rows of run ``a`` against run ``b`` (relative L2 per sample, over all slots)."""
    import torch

    rows_a, rows_b = load_rows(a), load_rows(b)
    common = sorted(set(rows_a) & set(rows_b))
    errs, equal, ids_differ = [], 0, []
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for i in common:
        (ids_a, ha), (ids_b, hb) = load_sample(rows_a[i], device), load_sample(rows_b[i], device)
        if not torch.equal(ids_a, ids_b):
            ids_differ.append(i)
            continue
        ha, hb = ha.float(), hb.float()
        if torch.equal(ha, hb):
            equal += 1
        errs.append(float((ha - hb).norm() / hb.norm().clamp_min(1e-12)))
    errs.sort()
    return {
        "samples": len(common),
        "only_in_one": len(set(rows_a) ^ set(rows_b)),
        "ids_differ": ids_differ,
        "bit_equal": equal,
        "rel_err_median": errs[len(errs) // 2] if errs else None,
        "rel_err_max": errs[-1] if errs else None,
        "ok": bool(common)
        and not ids_differ
        and len(set(rows_a) ^ set(rows_b)) == 0
        and (errs[-1] if errs else 1.0) < 0.05,
    }


def compare_with_transformers(out: Path, model: Path, samples: int, max_tokens: int, device: str) -> dict:
    """A few short samples of a run against transformers (float32), with the CPU tests' bounds, except
    the GPU tier's median-token bound where SGLang's own GPU numerics exceed the CPU's 1 % (the tiny
    DeepSeek-V3: 2 %, `capture_checks.GPU_MEDIAN_TOKEN_BOUND`, whose comment says why)."""
    import torch
    from capture_checks import GPU_MEDIAN_TOKEN_BOUND
    from hsextract.output.manifest import iter_entries, read_header
    from support import hf_reference
    from transformers import AutoModelForCausalLM

    header = read_header(out)
    rows = load_rows(out)
    short = {e.dataset_index for e in iter_entries(out) if e.tokens <= max_tokens}
    picked = [i for i in sorted(rows) if i in short][:samples]
    median_bound = (
        GPU_MEDIAN_TOKEN_BOUND.get(header.architecture, hf_reference.MEDIAN_TOKEN_BOUND)
        if device == "cuda"
        else hf_reference.MEDIAN_TOKEN_BOUND
    )
    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).to(device).eval()
    problems = {}
    for i in picked:
        ids, hidden = load_sample(rows[i])
        ref = hf_reference.reference(model, ids.tolist(), model=hf)
        found = hf_reference.row_problems(
            hidden,
            header.sglang_layers_to_capture,
            header.architecture,
            ref,
            header.final_hidden,
            median_bound=median_bound,
        )
        if found:
            problems[i] = found
    del hf
    return {
        "samples": picked,
        "median_token_bound": median_bound,
        "problems": problems,
        "ok": bool(picked) and not problems,
    }
