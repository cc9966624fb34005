"""Load an output directory's draft vocabulary files with a trainer's OWN code.

Runs inside `load_with_reader.py --serve PEER` (a request of kind "vocab"), with PYTHONPATH=<the
reader's --target dir>, because the readers conflict as one install. For each peer it calls the
trainer's own loader on the files, and the trainer's own builder on the counts, and saves both so
the parent test can compare them:

* specforge (0.2.0): ``Eagle3DraftModel.load_vocab_mapping`` (modeling/draft/base.py) into
  buffers of the right shapes, ``validate_vocab_mapping_consistency`` (core/compact_teacher.py),
  the reference ``process_token_dict_to_mappings`` (data/preprocessing.py) over token_freq, and
  ``count_effective_feature_tokens`` (training/vocab_mapping.py), SpecForge's own recount of a
  specforge-format directory.
* speculators (0.9.0): ``speculators.train.cli.parse_vocab_mappings`` as the trainer calls it,
  three ways (``d2t-<N>.npy`` found by --draft-vocab-size; --d2t-path/--t2d-path on d2t.npy and
  t2d.npy; regenerated from token_freq.pt alone), each through ``DraftVocabMixin.load_vocab_mappings``'s
  checks; and ``save_token_frequency_distribution`` over the Arrow dataset of a speculators directory.
* speculators-v1 (0.7.0.1): its trainer loads the mappings in scripts/train.py ``_load_mappings``
  (a script, not in the wheel): ``torch.from_numpy(np.load(...))`` of d2t.npy and t2d.npy and a
  check that ``d2t.shape[0]`` is --draft-vocab-size; reproduced here, then the wheel's own
  ``DraftVocabMixin.load_vocab_mappings`` checks (speculators/model.py).
* modelopt (0.47.0): ``HFEagleModel.load_draft_vocab_cache`` (plugins/hf_eagle.py), which
  checks shape and dtype exactly, into a d2t buffer of the draft size.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch


def _freq(out: Path) -> dict[int, int]:
    name = "token_freq.pt" if (out / "token_freq.pt").exists() else "token_freq.pth"
    return torch.load(out / name, weights_only=True)


def specforge(out: Path, sizes: list[int], vocab: int, suffix: str, model: Path | None) -> dict:
    from specforge.core.compact_teacher import validate_vocab_mapping_consistency
    from specforge.data.preprocessing import process_token_dict_to_mappings
    from specforge.modeling.draft.base import Eagle3DraftModel

    freq = _freq(out)
    res: dict = {"mappings": {}}
    for i, n in enumerate(sizes):
        names = [f"vocab_mapping/vocab_mapping-{n}{suffix}"]
        if i == 0:
            names.append(f"vocab_mapping/vocab_mapping{suffix}")
        for rel in names:
            holder = SimpleNamespace(t2d=torch.zeros(vocab, dtype=torch.bool), d2t=torch.zeros(n, dtype=torch.long))
            Eagle3DraftModel.load_vocab_mapping(holder, str(out / rel))
            assert holder.vocab_mapping_loaded
            validate_vocab_mapping_consistency(holder.t2d, holder.d2t)
            res["mappings"][rel] = {"d2t": holder.d2t, "t2d": holder.t2d}
        # SpecForge's own builder over the same counts, gathered in id order (ties then break by id).
        d2t, t2d = process_token_dict_to_mappings(Counter(dict(sorted(freq.items()))), n, vocab)
        res["mappings"][f"reference-{n}"] = {"d2t": d2t, "t2d": t2d}
    if any(out.rglob("*.ckpt")):
        from specforge.training.vocab_mapping import count_effective_feature_tokens

        res["recount"] = dict(count_effective_feature_tokens(str(out), target_vocab_size=vocab))
    return res


class _Holder(torch.nn.Module):
    """Buffers shaped as a speculators draft model's, for its own load_vocab_mappings checks."""

    def __init__(self, n: int, vocab: int):
        super().__init__()
        self.draft_vocab_size, self.verifier_vocab_size, self.use_draft_vocab = n, vocab, n != vocab
        self.register_buffer("t2d", torch.zeros(vocab, dtype=torch.bool))
        self.register_buffer("d2t", torch.zeros(n, dtype=torch.long))


def speculators(out: Path, sizes: list[int], vocab: int, suffix: str, model: Path | None) -> dict:
    from speculators.model import DraftVocabMixin
    from speculators.train.cli import parse_vocab_mappings

    def load(n: int, data_path: Path, **paths) -> dict:
        args = argparse.Namespace(
            d2t_path=None,
            t2d_path=None,
            draft_vocab_size=n,
            data_path=str(data_path),
            token_freq_path=None,
            verifier_name_or_path=str(model),
            trust_remote_code=False,
        )
        for k, v in paths.items():
            setattr(args, k, str(v))
        d2t, t2d, size = parse_vocab_mappings(args)
        assert size == n, (size, n)
        holder = _Holder(n, vocab)
        DraftVocabMixin.load_vocab_mappings(holder, t2d, d2t)
        return {"d2t": holder.d2t.clone(), "t2d": holder.t2d.clone()}

    res: dict = {"mappings": {}}
    for n in sizes:
        res["mappings"][f"d2t-{n}.npy"] = load(n, out)
        with tempfile.TemporaryDirectory() as tmp:  # token_freq.pt alone: the trainer builds the mapping itself
            shutil.copy(out / "token_freq.pt", Path(tmp) / "token_freq.pt")
            res["mappings"][f"reference-{n}"] = load(n, Path(tmp))
    res["mappings"]["d2t.npy"] = load(sizes[0], out, d2t_path=out / "d2t.npy", t2d_path=out / "t2d.npy")
    if (out / "state.json").exists():
        import datasets
        from speculators.train.vocab_mapping import save_token_frequency_distribution

        with tempfile.TemporaryDirectory() as tmp:
            save_token_frequency_distribution(datasets.load_from_disk(str(out)), Path(tmp) / "tf.pt")
            res["recount"] = torch.load(Path(tmp) / "tf.pt", weights_only=True)
    return res


def speculators_v1(out: Path, sizes: list[int], vocab: int, suffix: str, model: Path | None) -> dict:
    from speculators.model import DraftVocabMixin

    n = sizes[0]
    d2t = torch.from_numpy(np.load(out / "d2t.npy"))  # scripts/train.py _load_mappings, as it does it
    t2d = torch.from_numpy(np.load(out / "t2d.npy"))
    assert d2t.shape[0] == n, f"d2t.shape={d2t.shape}, --draft-vocab-size {n}"
    holder = _Holder(n, vocab)
    DraftVocabMixin.load_vocab_mappings(holder, t2d, d2t)
    return {"mappings": {"d2t.npy": {"d2t": holder.d2t.clone(), "t2d": holder.t2d.clone()}}}


def modelopt(out: Path, sizes: list[int], vocab: int, suffix: str, model: Path | None) -> dict:
    from modelopt.torch.speculative.plugins.hf_eagle import HFEagleModel

    res: dict = {"mappings": {}}
    for i, n in enumerate(sizes):
        names = [f"draft_vocab_cache/d2t-{n}{suffix}"] + ([f"draft_vocab_cache/d2t{suffix}"] if i == 0 else [])
        for rel in names:
            holder = SimpleNamespace(
                eagle_config=SimpleNamespace(draft_vocab_size=n, vocab_size=vocab),
                eagle_module=SimpleNamespace(d2t=torch.zeros(n, dtype=torch.int64)),
            )
            HFEagleModel.load_draft_vocab_cache(holder, str(out / rel))
            res["mappings"][rel] = {"d2t": holder.eagle_module.d2t.clone()}
    return res


PEERS = {"specforge": specforge, "speculators": speculators, "speculators-v1": speculators_v1, "modelopt": modelopt}


def vocab_mappings(peer: str, root: str, sizes: list[int], vocab_size: int, suffix: str, model: str | None) -> dict:
    """What `peer`'s own vocabulary loaders and builders make of the output `root`'s files and counts."""
    return PEERS[peer](Path(root), sizes, vocab_size, suffix, Path(model) if model else None)
