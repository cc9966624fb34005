"""Each trainer's draft-vocabulary files, written into the output directory.

::

    vocab_mapping/vocab_mapping.pt       SpecForge: {"d2t": int64 [N], "t2d": bool [V]} (--vocab-mapping-path)
    vocab_mapping/vocab_mapping-<N>.pt     ... one per size
    token_freq.pt                        speculators: {token id: count} (prepare_data's file)
    d2t.npy, t2d.npy                     speculators: int64 [N] offsets, bool [V] (the first size)
    d2t-<N>.npy, t2d-<N>.npy               ... one per size (speculators >= 0.9 finds them by --draft-vocab-size)
    draft_vocab_cache/d2t.pt             ModelOpt: int64 [N] offsets in frequency order (data.draft_vocab_cache)
    draft_vocab_cache/d2t-<N>.pt           ... one per size
    draft_vocab.json                     what was counted, the sizes, each size's coverage, the files

The unsuffixed files are for the first size given. Formats whose reader takes every file ending
in "pt" under the output directory as a sample (speculators-v1, modelopt) get the torch files
as ``.pth`` instead (same contents; pass them by path), so the readers never see them.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hsextract.formats.durable import atomic_write_bytes
from hsextract.vocab.counts import TokenCounts
from hsextract.vocab.mapping import DraftSize, check_ids, coverage, frequency_d2t, select_tokens, sorted_mapping

SUMMARY_FILE = "draft_vocab.json"
SPECFORGE_DIR = "vocab_mapping"
MODELOPT_DIR = "draft_vocab_cache"


def torch_suffix(reads_every_pt_file: bool) -> str:
    return ".pth" if reads_every_pt_file else ".pt"


def token_freq_name(suffix: str) -> str:
    return f"token_freq{suffix}"


def _torch_bytes(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def write_vocab_files(out: Path, counts: TokenCounts, vocab_size: int, sizes: Sequence[DraftSize],
                      *, suffix: str, covered: int) -> list[Path]:
    """Write every trainer's files for every size (atomically, durably); return the paths written.

    ``token_freq`` needs no vocabulary size and is written first, so the counts are on disk even
    when the mappings cannot be built.
    """
    import torch

    out = Path(out)
    written: list[Path] = []

    def put(rel: str, data: bytes) -> None:
        atomic_write_bytes(out / rel, data)
        written.append(out / rel)

    put(token_freq_name(suffix), _torch_bytes(counts.to_dict()))
    check_ids(counts, vocab_size)
    per_size = []
    for i, d in enumerate(sizes):
        selected = select_tokens(counts, d.size)
        d2t, t2d = sorted_mapping(selected, vocab_size)
        mo = frequency_d2t(selected)
        names = {
            "specforge": [f"{SPECFORGE_DIR}/vocab_mapping-{d.size}{suffix}"],
            "speculators": [f"d2t-{d.size}.npy", f"t2d-{d.size}.npy"],
            "modelopt": [f"{MODELOPT_DIR}/d2t-{d.size}{suffix}"],
        }
        if i == 0:
            names["specforge"].append(f"{SPECFORGE_DIR}/vocab_mapping{suffix}")
            names["speculators"] += ["d2t.npy", "t2d.npy"]
            names["modelopt"].append(f"{MODELOPT_DIR}/d2t{suffix}")
        sf = _torch_bytes({"d2t": torch.from_numpy(d2t), "t2d": torch.from_numpy(t2d)})
        for rel in names["specforge"]:
            put(rel, sf)
        for rel in names["speculators"]:
            put(rel, _npy_bytes(d2t if Path(rel).name.startswith("d2t") else t2d))
        mo_bytes = _torch_bytes(torch.from_numpy(mo))
        for rel in names["modelopt"]:
            put(rel, mo_bytes)
        per_size.append({"size": d.size, "requested": d.requested, "coverage": round(coverage(counts, selected), 6),
                         "files": names})
    summary = {
        "samples": covered,
        "masked_tokens": counts.total,
        "distinct_tokens": counts.distinct,
        "vocab_size": vocab_size,
        "token_freq": token_freq_name(suffix),
        "sizes": per_size,
        "selection": "loss-masked tokens; count descending, then id ascending; padded with the lowest uncounted ids",
    }
    put(SUMMARY_FILE, (json.dumps(summary, indent=2) + "\n").encode())
    return written


def write_token_freq_only(out: Path, counts: TokenCounts, *, suffix: str) -> list[Path]:
    path = Path(out) / token_freq_name(suffix)
    atomic_write_bytes(path, _torch_bytes(counts.to_dict()))
    return [path]


def read_token_freq(path: Path) -> TokenCounts:
    import torch

    return TokenCounts.from_dict(torch.load(path, weights_only=True))


def read_summary(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(out) / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
