"""Load an output directory with a trainer's OWN reader and save what it yields (run in a subprocess).

Usage: python load_with_reader.py FORMAT OUTPUT_DIR RESULT.pt --num-aux K --hidden H
       python load_with_reader.py --serve FORMAT   (one load per JSON line on stdin; see `serve`;
                                                    it also loads draft vocabularies, vocab_with_reader.py)

Runs with PYTHONPATH=<the reader's --target dir>, because the readers conflict as one install.
The call chains are the trainers' own (see the facts on trainer readers): SpecForge's offline
reader + feature store + loader + eagle3 normalizer; speculators' ArrowDataset (0.9.0, its hidden
states through the trainer's `--hidden-states-backend`, file or fp8) or SampleFileDataset (0.7.0.1,
v1), each through `_setup_dataloader` with `shift_batch`; ModelOpt's
OfflineSupervisedDataset + EagleOfflineDataCollator (nvidia-modelopt 0.47.0).

RESULT.pt gets {"samples": {key: {tensor name: tensor}}, "batches": n, "error_records": n,
"approx_lengths": [...], "keys": [...]}, where key is the output index read from the file name
(specforge, v1, modelopt) or the Arrow row (speculators). The parent test compares it with the captured data.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import torch


def _index_of(path: str) -> int:
    m = re.search(r"_(\d+)\.(ckpt|pt)(\.gz)?$", str(path))
    assert m, path
    return int(m.group(1))


def load_specforge(root: str, num_aux: int, hidden: int) -> dict:
    os.environ["SPECFORGE_VALIDATE_OFFLINE_FEATURES"] = "1"
    from specforge.algorithms.eagle3.providers import create_registration
    from specforge.runtime.data_plane.feature_dataloader import FeatureDataLoader
    from specforge.runtime.data_plane.feature_store import LocalFeatureStore

    reg = create_registration()
    prov = reg.providers.offline_for("text")
    assert prov.normalizer_id == "eagle3_offline_v1", prov.normalizer_id
    max_len = 1 << 20
    refs = prov.build_reader(root, run_id="t", ttt_length=7, max_len=max_len).read()
    norm = prov.build_normalizer(max_len, ttt_length=7, use_usp_preprocess=False)

    def cat(fs):
        return {k: torch.cat([f[k] for f in fs]) for k in fs[0]}

    loader = FeatureDataLoader(
        LocalFeatureStore("t"),
        refs=refs,
        batch_size=1,
        collate_fn=cat,
        per_sample_transform=norm,
        drop_last=False,
        strategy=reg.name,
    )
    samples, n = {}, 0
    uri_of = {r.sample_id: r.feature_store_uri for r in refs}
    for batch in loader:
        (sample_id,) = batch.sample_ids
        samples[_index_of(uri_of[sample_id])] = {k: v.clone() for k, v in batch.tensors.items()}
        n += 1
    # The reader's own numbering: sample_id "<run>:<position>", the position in its sorted list of files.
    order = [_index_of(r.feature_store_uri) for r in sorted(refs, key=lambda r: r.sample_id)]
    return {
        "samples": samples,
        "batches": n,
        "error_records": 0,
        "approx_lengths": [],
        "keys": sorted(samples),
        "order": order,
    }


def _collate_all(ds, num_aux: int, hidden: int) -> tuple[int, int]:
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.dataloader import _setup_dataloader

    total = max(64, 2 * max(ds.approx_lengths))
    loader = _setup_dataloader(
        ds, total_seq_len=total, hidden_size=hidden, num_workers=0, num_target_layers=num_aux, preprocess=shift_batch
    )
    batches, errors = 0, 0
    for batch in loader:
        batches += 1
        err = batch.get("error_records", 0)
        errors += int(err if not torch.is_tensor(err) else err.sum())
        assert batch["hidden_states"].shape[-1] == num_aux * hidden, batch["hidden_states"].shape
    return batches, errors


def load_speculators(root: str, num_aux: int, hidden: int, backend: str = "file") -> dict:
    """speculators 0.9's ArrowDataset over the set, its hidden states through the trainer's backend
    (`--hidden-states-backend`: "file", FileTransfer, its default; "fp8", hs_connectors' FP8Transfer)."""
    from pathlib import Path

    from hs_connectors.transfer import HiddenStatesBackend
    from speculators.train.data import ArrowDataset

    # As the trainer's cli builds it: the backend's class from its registry, then from_train_args.
    args = argparse.Namespace(hidden_states_path=None)
    transfer = HiddenStatesBackend.registry[backend].from_train_args(args, root)
    assert transfer.hidden_states_path == Path(root) / "hidden_states", transfer.hidden_states_path
    ds = ArrowDataset(max_len=1 << 20, datapath=root, on_missing="raise", transfer=transfer)
    samples = {}
    for i in range(len(ds)):
        item = ds[i]
        assert isinstance(item, dict), f"row {i}: reader returned {item!r} (sample unavailable)"
        samples[i] = {k: v.clone() for k, v in item.items() if torch.is_tensor(v)}
    batches, errors = _collate_all(ds, num_aux, hidden)
    return {
        "samples": samples,
        "batches": batches,
        "error_records": errors,
        "approx_lengths": list(ds.approx_lengths),
        "keys": list(range(len(ds))),
        "transfer": type(transfer).__name__,
    }


def load_speculators_v1(root: str, num_aux: int, hidden: int) -> dict:
    from speculators.train.data import SampleFileDataset

    ds = SampleFileDataset(max_len=1 << 20, datapath=root)
    samples = {}
    keys = [_index_of(p) for p in ds.data]
    for i, key in enumerate(keys):
        item = ds[i]
        samples[key] = {k: v.clone() for k, v in item.items() if torch.is_tensor(v)}
    batches, errors = _collate_all(ds, num_aux, hidden)
    return {
        "samples": samples,
        "batches": batches,
        "error_records": errors,
        "approx_lengths": list(ds.approx_lengths),
        "keys": keys,
    }


def load_modelopt(root: str, num_aux: int, hidden: int) -> dict:
    # The trainer's offline data module (examples/speculative_decoding/eagle_utils.py,
    # make_speculative_data_module, a script, not in the wheel) lists the files so:
    #   dumped_files = [str(p) for p in Path(offline_data_path).rglob("*.pt")]
    # and hands them to the wheel's OfflineSupervisedDataset and EagleOfflineDataCollator.
    from pathlib import Path

    from modelopt.torch.speculative.eagle.utils import EagleOfflineDataCollator, OfflineSupervisedDataset

    files = [str(p) for p in Path(root).rglob("*.pt")]
    ds = OfflineSupervisedDataset(files, answer_only_loss=True)
    samples, prenorm = {}, []
    for i, f in enumerate(files):
        item = ds[i]
        samples[int(Path(f).stem)] = {k: v.clone() for k, v in item.items() if torch.is_tensor(v)}
        prenorm.append(bool(item["base_hidden_prenorm"]))
    train_len = max(64, 2 * max(int(s["input_ids"].shape[0]) for s in samples.values()))
    batch = EagleOfflineDataCollator(train_len=train_len)([ds[i] for i in range(len(ds))])
    outputs = batch["base_model_outputs"]
    assert batch["input_ids"].shape == (len(ds), train_len), batch["input_ids"].shape
    assert outputs["base_model_hidden_states"].shape == (len(ds), train_len, hidden)
    assert outputs["aux_hidden_states"].shape == (len(ds), train_len, num_aux * hidden)
    assert outputs["base_hidden_prenorm"] is False
    return {
        "samples": samples,
        "batches": 1,
        "error_records": 0,
        "approx_lengths": [],
        "keys": sorted(samples),
        "prenorm": prenorm,
    }


LOADERS = {
    "specforge": load_specforge,
    "speculators": load_speculators,
    "speculators-v1": load_speculators_v1,
    "modelopt": load_modelopt,
}


def _save(out: dict, result: str) -> None:
    """Save what a reader yielded for the parent test, with the serving stacks it pulled in (none may be)."""
    out["modules"] = sorted(m for m in ("sglang", "vllm") if m in sys.modules)
    torch.save(out, result)


def load(fmt: str, root: str, result: str, num_aux: int, hidden: int, backend: str = "") -> str:
    out = LOADERS[fmt](root, num_aux, hidden, backend) if backend else LOADERS[fmt](root, num_aux, hidden)
    _save(out, result)
    return f"loaded {len(out['samples'])} samples, {out['batches']} batches, {out['error_records']} error records"


def answer(fmt: str, req: dict) -> str:
    """One request of `serve`: a training set's samples (the default kind), or with "kind": "vocab"
    its draft vocabulary files (vocab_with_reader.py, the same reader install)."""
    if req.get("kind") == "vocab":
        from vocab_with_reader import vocab_mappings  # beside this file, on sys.path as the script's dir

        out = vocab_mappings(fmt, req["root"], req["sizes"], req["vocab_size"], req["suffix"], req.get("model"))
        _save(out, req["result"])
        return f"{fmt}: loaded {len(out['mappings'])} mappings"
    return load(fmt, req["root"], req["result"], req["num_aux"], req["hidden"], req.get("backend", ""))


def serve(fmt: str) -> int:
    """Load one output per request, in this one process: a reader's imports (torch, transformers,
    the trainer's package) take about 10 CPU-seconds, which a process per load would spend each time.

    A request is a JSON line on stdin (`answer` says which); the answer a JSON line, {"ok": true,
    "message"} or {"ok": false, "error": the traceback}. What the readers print goes to stderr, so
    that stdout carries the answers only. Ends at the end of stdin.
    """
    import json
    import traceback

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        try:
            reply = {"ok": True, "message": answer(fmt, json.loads(line))}
        except BaseException:  # any failure of the reader is the test's to report
            reply = {"ok": False, "error": traceback.format_exc()}
        answers.write(json.dumps(reply) + "\n")
        answers.flush()
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--serve"] and len(sys.argv) == 3 and sys.argv[2] in LOADERS:
        return serve(sys.argv[2])
    ap = argparse.ArgumentParser()
    ap.add_argument("format", choices=sorted(LOADERS))
    ap.add_argument("root")
    ap.add_argument("result")
    ap.add_argument("--num-aux", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    a = ap.parse_args()
    print(load(a.format, a.root, a.result, a.num_aux, a.hidden))
    return 0


if __name__ == "__main__":
    sys.exit(main())
