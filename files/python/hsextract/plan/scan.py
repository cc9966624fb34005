"""Tokenize a dataset exactly as the client will, on every core, and tally what the run will send.

The main process reads the dataset with the client's reader (`read_dataset`: same indices, same
rejects, duplicates judged over the whole file) and takes this host's shard; worker processes
encode the samples with the client's encoder (`build_encoder`: the model's tokenizer and chat
template, the same length policy). Workers are forked from a fork server that imported the
client's modules once (so each worker starts in a fraction of a second, without sharing the
parent's threads or tokenizer state) and load the tokenizer once each.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hsextract.dataset import defaults
from hsextract.dataset.chat_template import TOO_LONG, Encoded, build_encoder
from hsextract.dataset.direct_tokenizer import DirectTokenizer
from hsextract.dataset.reader import DatasetReader, Reject, Sample, count_rows, read_dataset
from hsextract.formats.index_width import same_size_index
from hsextract.shard import WHOLE, Shard

CHUNK = 64  # samples per task: large enough to amortize the pickling, small enough for a smooth bar
# Rows per worker below which another process costs more to start (imports, tokenizer) than it saves:
# one process tokenizes about a thousand chat samples per second.
MIN_ROWS_PER_WORKER = 2000


def default_workers(rows: int, cores: int) -> int:
    """Every core, unless the dataset is too small for the extra processes to pay for their start."""
    return max(1, min(cores, rows // MIN_ROWS_PER_WORKER))


@dataclass
class ScanSettings:
    dataset: Path
    model: Path
    chat_template: str | None = None
    max_tokens: int | None = None
    overlong: str = "truncate"
    last_turn_only: bool = False
    min_loss_tokens: int = 0
    shard: Shard = WHOLE
    done: frozenset[int] = frozenset()  # dataset indices already in the training set
    workers: int | None = None  # None: `default_workers`
    progress: bool = True
    max_row_bytes: int = defaults.MAX_ROW_BYTES
    context_length: int | None = None  # the server's --context-length, if it is given one
    kv_pool_tokens: int | None = None  # the server's --max-total-tokens, if it is given one


@dataclass
class ScanResult:
    """What the client would do with every row of this shard."""

    lines: int = 0  # rows of the dataset (all shards)
    in_shard: int = 0
    samples: int = 0  # encoded: what the server will run
    already_written: int = 0  # of those, in the training set already (the client skips them)
    rejects: Counter = field(default_factory=Counter)
    tokens: int = 0
    masked_tokens: int = 0
    truncated: int = 0
    max_tokens: int | None = None
    lengths: list[int] = field(default_factory=list)
    # (tokens, same_size_index(dataset index)) -> samples: everything a sample file's size depends on
    shapes: Counter = field(default_factory=Counter)
    pending_shapes: Counter = field(default_factory=Counter)  # the same, of samples not yet written
    pending_tokens: int = 0
    seconds: float = 0.0
    workers: int = 1
    examples: dict[str, str] = field(default_factory=dict)  # reject reason -> one "line N: detail"
    reused: bool = False  # taken from the scan kept beside the report (hsextract.plan.reuse), not made now
    # Every sample's (dataset index, tokens, loss-masked tokens, length it was cut from or 0), as
    # columns: what the scan is kept as, for the next plan of the same inputs.
    _columns: tuple[array, array, array, array] = field(
        default_factory=lambda: (array("q"), array("q"), array("q"), array("q")), repr=False
    )

    @property
    def overlong(self) -> int:
        return self.truncated + self.rejects.get(TOO_LONG, 0)

    def percentiles(self) -> dict[str, float]:
        if not self.lengths:
            return {}
        a = np.asarray(self.lengths)
        q = np.percentile(a, [50, 90, 99])
        return {
            "p50": float(q[0]),
            "p90": float(q[1]),
            "p99": float(q[2]),
            "max": int(a.max()),
            "min": int(a.min()),
            "mean": round(float(a.mean()), 1),
        }

    def reject(self, r: Reject) -> None:
        self.rejects[r.reason] += 1
        where = f"{r.file}:{r.line}" if r.file else f"line {r.line}"
        self.examples.setdefault(r.reason, f"{where}: {r.detail}")

    def columns(self) -> dict[str, array]:
        return dict(zip(("index", "tokens", "masked", "truncated_from"), self._columns, strict=True))

    def add(self, index: int, tokens: int, masked: int, truncated_from: int, done: frozenset[int]) -> None:
        """One encoded sample: counted, and counted as remaining unless it is in `done`."""
        self.take(index, tokens, masked, truncated_from)
        if index in done:
            self.already_written += 1
        else:
            self.pending_tokens += tokens
            self.pending_shapes[(tokens, same_size_index(index))] += 1

    def take(self, index: int, tokens: int, masked: int, truncated_from: int) -> None:
        for column, value in zip(self._columns, (index, tokens, masked, truncated_from or 0), strict=True):
            column.append(value)
        self.samples += 1
        self.tokens += tokens
        self.masked_tokens += masked
        self.truncated += bool(truncated_from)
        self.lengths.append(tokens)
        key = (tokens, same_size_index(index))
        self.shapes[key] += 1


# --- the workers ------------------------------------------------------------------------------------

_ENCODER = None


def _init_worker(model: str, *settings) -> None:
    global _ENCODER
    _ENCODER = build_encoder(Path(model), *settings)


def _encode_chunk(chunk: tuple[int, list[Sample]]) -> tuple[int, list[tuple | Reject]]:
    """(rows covered, [(index, tokens, masked, truncated_from) or a Reject])."""
    rows, samples = chunk
    out: list[tuple | Reject] = []
    encoder = _ENCODER
    assert encoder is not None, "_init_worker (or scan, in-process) sets the encoder first"
    for s in samples:
        enc = encoder.encode(s)
        if isinstance(enc, Encoded):
            out.append((enc.index, len(enc.input_ids), int(sum(enc.loss_mask)), enc.truncated_from))
        else:
            out.append(enc)  # a Reject, with its file and row
    return rows, out


# --- the main process -------------------------------------------------------------------------------


def _chunks(cfg: ScanSettings, res: ScanResult, parse_rejects: list[Reject]) -> Iterator[tuple[int, list[Sample]]]:
    """Chunks of this shard's samples; rows read, shard membership and reader rejects are tallied here."""
    batch: list[Sample] = []
    rows = 0
    for item in read_dataset(cfg.dataset, DatasetReader(max_row_bytes=cfg.max_row_bytes)):
        res.lines += 1
        rows += 1
        if not cfg.shard.takes(item.index):
            continue
        res.in_shard += 1
        if isinstance(item, Reject):
            parse_rejects.append(item)
            continue
        batch.append(item)
        if len(batch) >= CHUNK:
            yield rows, batch
            batch, rows = [], 0
    yield rows, batch


def scan(cfg: ScanSettings) -> ScanResult:
    """Encode every sample of this shard as the client would; return the tallies."""
    rows = count_rows(cfg.dataset)
    res = ScanResult(workers=max(1, cfg.workers or default_workers(rows, os.cpu_count() or 1)))
    encoder = build_encoder(
        cfg.model,
        cfg.chat_template,
        cfg.max_tokens,
        cfg.overlong,
        cfg.last_turn_only,
        cfg.min_loss_tokens,
        cfg.context_length,
        cfg.kv_pool_tokens,
    )  # fails early, in the parent
    res.max_tokens = encoder.max_tokens
    # the workers cut to the limit the parent resolved (and said so, once)
    settings = (
        cfg.chat_template,
        encoder.max_tokens,
        cfg.overlong,
        cfg.last_turn_only,
        cfg.min_loss_tokens,
        cfg.context_length,
        cfg.kv_pool_tokens,
    )
    parse_rejects: list[Reject] = []
    bar = _progress(rows, cfg.progress)
    started = time.perf_counter()
    chunks = _chunks(cfg, res, parse_rejects)
    if res.workers == 1:
        global _ENCODER
        _ENCODER = encoder
        results: Iterator[tuple[int, list[tuple | Reject]]] = map(_encode_chunk, chunks)
        pool = None
    else:
        ctx = multiprocessing.get_context("forkserver")
        preload = ["hsextract.dataset.chat_template"]
        if not isinstance(encoder.tok, DirectTokenizer):  # the workers load it through transformers too
            preload.append("transformers.models.auto.tokenization_auto")
        ctx.set_forkserver_preload(preload)
        pool = ctx.Pool(res.workers, initializer=_init_worker, initargs=(str(cfg.model), *settings))
        results = pool.imap_unordered(_encode_chunk, chunks, chunksize=1)
    try:
        for rows, items in results:
            for item in items:
                if isinstance(item, Reject):
                    res.reject(item)
                    continue
                index, tokens, masked, truncated_from = item
                res.add(index, tokens, masked, truncated_from, cfg.done)
            bar.update(rows)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        bar.close()
    for r in parse_rejects:
        res.reject(r)
    res.seconds = time.perf_counter() - started
    return res


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(
        total=total, unit=" rows", desc="tokenizing", file=sys.stderr, smoothing=0.1, disable=None
    )  # None: no bar off a terminal (journald, CI logs)
