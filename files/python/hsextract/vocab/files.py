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

Which files each trainer gets is its format's registry entry (`hsextract.formats.VocabFile`); what
each kind of file holds is written here. The unsuffixed files are for the first size given (hard
links to its files). Formats whose
reader takes every file ending in "pt" under the output directory as a sample (speculators-v1,
modelopt) get the torch files as ``.pth`` instead (same contents; pass them by path), so the
readers never see them.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from hsextract.durable import fsync_dir, temporary_name, write_file_durably
from hsextract.formats import FORMATS, VocabFile
from hsextract.vocab.counts import TokenCounts
from hsextract.vocab.mapping import DraftSize, check_ids, coverage, frequency_d2t, select_tokens, sorted_mapping

SUMMARY_FILE = "draft_vocab.json"


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


def write_vocab_files(
    out: Path,
    counts: TokenCounts,
    vocab_size: int,
    sizes: Sequence[DraftSize],
    *,
    suffix: str,
    covered: int,
    also: dict[str, bytes] | None = None,
) -> list[Path]:
    """Write every trainer's files for every size, and the files in `also`, in one durable batch;
    return the paths written.

    When the mappings cannot be built (a trained-on id outside the vocabulary) ``token_freq`` and
    `also` are still written, then the error is raised. The first size's unsuffixed names are
    hard links to its suffixed files (the same bytes, written and fsynced once).
    """
    out = Path(out)
    files: dict[str, bytes] = {**(also or {}), token_freq_name(suffix): _torch_bytes(counts.to_dict())}
    try:
        check_ids(counts, vocab_size)
    except Exception:
        write_batch(out, files, {})
        raise
    links: dict[str, str] = {}
    per_size = []
    for i, d in enumerate(sizes):
        selected = select_tokens(counts, d.size)
        size_files, names = _size_files(d.size, selected, vocab_size, suffix)
        files.update(size_files)
        if i == 0:  # the unsuffixed names: links to the first size's files
            first = _first_size_links(d.size, suffix)
            links.update(first)
            for trainer_files in names.values():
                trainer_files += [name for name, target in first.items() if target in trainer_files]
        per_size.append(
            {"size": d.size, "requested": d.requested, "coverage": round(coverage(counts, selected), 6), "files": names}
        )
    summary = {
        "samples": covered,
        "masked_tokens": counts.total,
        "distinct_tokens": counts.distinct,
        "vocab_size": vocab_size,
        "token_freq": token_freq_name(suffix),
        "sizes": per_size,
        "selection": "loss-masked tokens; count descending, then id ascending; padded with the lowest uncounted ids",
    }
    files[SUMMARY_FILE] = (json.dumps(summary, indent=2) + "\n").encode()
    write_batch(out, files, links)
    return [*(out / rel for rel in files), *(out / rel for rel in links)]


# What each kind of draft-vocabulary file holds (hsextract.formats.VocabFile.kind).
VOCAB_KINDS = ("mapping", "d2t", "t2d", "frequency_d2t")


def _trainers() -> list[tuple[str, tuple[VocabFile, ...]]]:
    """Each format's draft-vocabulary files, in the registry's order; a format whose files are an
    earlier one's (speculators v1's are speculators') is not listed apart."""
    out: list[tuple[str, tuple[VocabFile, ...]]] = []
    for name, spec in FORMATS.items():
        if all(spec.vocab_files != files for _, files in out):
            out.append((name, spec.vocab_files))
    return out


def _encode(kind: str, selected: np.ndarray, d2t: np.ndarray, t2d: np.ndarray) -> bytes:
    """The bytes of a file of `kind` for the tokens `selected` (their d2t and t2d given)."""
    import torch

    if kind == "mapping":  # SpecForge's load_vocab_mapping
        return _torch_bytes({"d2t": torch.from_numpy(d2t), "t2d": torch.from_numpy(t2d)})
    if kind == "d2t":
        return _npy_bytes(d2t)
    if kind == "t2d":
        return _npy_bytes(t2d)
    if kind == "frequency_d2t":  # ModelOpt's calibrate_frequent_vocab order
        return _torch_bytes(torch.from_numpy(frequency_d2t(selected)))
    raise ValueError(f"draft-vocabulary file kind {kind!r}: expected one of {', '.join(VOCAB_KINDS)}")


def _size_files(
    size: int, selected: np.ndarray, vocab_size: int, suffix: str
) -> tuple[dict[str, bytes], dict[str, list[str]]]:
    """One draft size's files (path -> bytes), and each trainer's names among them."""
    d2t, t2d = sorted_mapping(selected, vocab_size)
    files: dict[str, bytes] = {}
    names: dict[str, list[str]] = {}
    for trainer, vocab in _trainers():
        names[trainer] = [f.name.format(size=f"-{size}", pt=suffix) for f in vocab]
        for f, rel in zip(vocab, names[trainer], strict=True):
            files[rel] = _encode(f.kind, selected, d2t, t2d)
    return files, names


def _first_size_links(size: int, suffix: str) -> dict[str, str]:
    """The unsuffixed names (link -> the first size's file): what a trainer finds without a size."""
    return {
        f.name.format(size="", pt=suffix): f.name.format(size=f"-{size}", pt=suffix)
        for _, vocab in _trainers()
        for f in vocab
    }


def write_batch(out: Path, files: dict[str, bytes], links: dict[str, str]) -> None:
    """Replace each file, and each link with a hard link to a file of the batch, all durably.

    Every new file is written and fsynced under a temporary name, then all are renamed into
    place and each directory is fsynced once: a crash leaves each name with its old or its new
    bytes, never a partial file. The fsyncs run in parallel, so the filesystem commits them
    together (measured on 2 cores: 3 ms for seven files, against 15-50 ms one after another).
    """
    dirs: set[Path] = set()
    staged: list[tuple[Path, Path]] = []
    for rel in files:
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        staged.append((temporary_name(dst), dst))
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(staged)))) as pool:
        list(pool.map(lambda pair: write_file_durably(pair[0][0], [pair[1]]), zip(staged, files.values(), strict=True)))
    for rel, src in links.items():
        dst = out / rel
        tmp = temporary_name(dst)
        staged.append((tmp, dst))
        target = next(t for t, d in staged if d == out / src)
        try:
            os.link(target, tmp)
        except OSError:  # a filesystem without hard links: a copy
            write_file_durably(tmp, [files[src]])
    for tmp, dst in staged:
        os.replace(tmp, dst)
        dirs.add(dst.parent)
    with ThreadPoolExecutor(max_workers=max(1, len(dirs))) as pool:
        list(pool.map(fsync_dir, dirs))


def write_token_freq_only(
    out: Path, counts: TokenCounts, *, suffix: str, also: dict[str, bytes] | None = None
) -> list[Path]:
    files = {**(also or {}), token_freq_name(suffix): _torch_bytes(counts.to_dict())}
    write_batch(Path(out), files, {})
    return [Path(out) / rel for rel in files]


def read_token_freq(path: Path) -> TokenCounts:
    import torch

    return TokenCounts.from_dict(torch.load(path, weights_only=True))


def read_summary(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(out) / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
