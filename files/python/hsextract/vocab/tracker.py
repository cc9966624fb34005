"""Token counts kept in step with the manifest: the drain's hook, and ``hsextract finalize``'s.

The drain's committer calls `VocabTracker.add` right after it appends manifest lines, with the
per-sample counts its workers computed from the very tensors written (`masked_counts`). The
counts are checkpointed every `checkpoint_interval_s` and at finalize; at start, `recover`
loads the checkpoint and recounts the entries past it from their files. So at any instant after
a restart the counts equal a recount of the training set's files, whatever instant the previous
process died at.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hsextract.formats.base import TokenReader
from hsextract.output.layout import vocab_checkpoint_path, vocab_checkpoint_relpath
from hsextract.output.manifest import ManifestEntry
from hsextract.vocab.checkpoint import (
    Checkpoint,
    checkpoint_bytes,
    entry_identity,
    read_checkpoint,
    write_checkpoint,
)
from hsextract.vocab.counts import TokenCounts, masked_counts
from hsextract.vocab.files import (
    read_summary,
    read_token_freq,
    token_freq_name,
    torch_suffix,
    write_token_freq_only,
    write_vocab_files,
)
from hsextract.vocab.mapping import VocabError, clamp_message, resolve_sizes

log = logging.getLogger("hsextract.vocab")


def recount(out: Path, fmt, entries: Sequence[ManifestEntry], tokens: TokenReader | None = None) -> TokenCounts:
    """The loss-masked token counts of `entries`, read back from their files (through `tokens`
    where the files are not under `out`: a set in a bucket)."""
    counts = TokenCounts()
    for e in entries:
        path = Path(out) / e.file
        try:
            ids, mask = fmt.read_tokens(path) if tokens is None else tokens(e)
            counts.add(*masked_counts(ids, mask))
        except Exception as exc:  # a missing or damaged file: torch, safetensors and numpy raise many kinds
            raise VocabError(
                f"cannot count the tokens of sample {e.output_index} ({path}): {type(exc).__name__}: "
                f"{str(exc)[:200]}; `hsextract finalize --output {out} --verify` checks every file"
            ) from exc
    return counts


class VocabTracker:
    """The running counts of one output directory, their checkpoint and the trainers' files."""

    def __init__(
        self,
        out: Path,
        fmt,
        sizes: Sequence[int],
        checkpoint_interval_s: float = 30.0,
        tokens: TokenReader | None = None,
    ):
        self.out = Path(out)
        self.tokens = tokens  # where the sample files are not under `out` (a set in a bucket)
        self.fmt = fmt
        self.sizes = list(sizes)
        self.interval = checkpoint_interval_s
        self.suffix = torch_suffix(bool(getattr(fmt, "reads_every_pt_file", False)))
        self.counts = TokenCounts()
        self.covered = 0
        self.last: dict | None = None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one checkpoint write at a time (committer and finalize)
        self._saved_at = time.monotonic()
        self._saved_covered = -1
        self.discarded = ""  # why the checkpoint was not used, when samples had to be recounted for it

    def recover(self, entries: Sequence[ManifestEntry], save: bool = True) -> int:
        """Load the checkpoint and count the entries past it from their files; return how many were recounted.
        The new counts are checkpointed, unless `save` is false (a check, which writes nothing)."""
        entries = list(entries)
        cp, why = read_checkpoint(self.out)
        if cp is not None and not cp.matches(entries):
            why = (
                f"it covers {cp.covered} samples ending with {cp.last}, which is not a prefix of the manifest's "
                f"{len(entries)}"
            )
            cp = None
        if cp is None:
            cp = Checkpoint(0, None, TokenCounts())
            if entries:
                self.discarded = why
                log.warning("draft vocabulary: recounting all %d samples from their files (%s)", len(entries), why)
        tail = entries[cp.covered :]
        cp.counts.merge(recount(self.out, self.fmt, tail, self.tokens))
        with self._lock:
            self.counts, self.covered = cp.counts, len(entries)
            self.last = entry_identity(entries[-1]) if entries else None
        if tail:
            log.info("draft vocabulary: counted the %d samples written after the last checkpoint", len(tail))
            if save:
                self.checkpoint()
        return len(tail)

    def add(
        self, entries: Sequence[ManifestEntry], per_sample: Sequence[tuple[np.ndarray, np.ndarray] | None], covered: int
    ) -> None:
        """Count samples just recorded in the manifest, which now has `covered` entries (committer thread);
        a sample without counts (None) is a VocabError."""
        counts = [c for c in per_sample if c is not None]
        if len(per_sample) != len(entries) or len(counts) != len(entries):
            raise VocabError(f"draft vocabulary: {len(entries)} samples committed with {len(counts)} counts")
        with self._lock:
            if self.covered + len(entries) != covered:
                raise VocabError(
                    f"draft vocabulary: counts cover {self.covered} samples, the manifest "
                    f"{covered - len(entries)} before this commit"
                )
            for ids, n in counts:
                self.counts.add(ids, n)
            self.covered = covered
            self.last = entry_identity(entries[-1])
        if time.monotonic() - self._saved_at >= self.interval:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Write the checkpoint (atomically) if it is behind."""
        with self._write_lock:
            with self._lock:
                if self.covered == self._saved_covered:
                    return
                ids, n = self.counts.items()
                cp = Checkpoint(self.covered, self.last, TokenCounts.from_pairs(ids, n))
            write_checkpoint(self.out, cp)
            self._saved_covered, self._saved_at = cp.covered, time.monotonic()

    def snapshot(self) -> tuple[TokenCounts, int]:
        with self._lock:
            ids, n = self.counts.items()
            return TokenCounts.from_pairs(ids, n), self.covered

    def write_files(self, vocab_size: int) -> list[Path]:
        """Write the checkpoint and every trainer's files for the configured sizes, in one durable
        batch; return the paths.

        Without a vocabulary size only ``token_freq`` can be written; that is logged, with how to fix it.
        """
        with self._write_lock:
            with self._lock:
                ids, n = self.counts.items()
                cp = Checkpoint(self.covered, self.last, TokenCounts.from_pairs(ids, n))
            also = {vocab_checkpoint_relpath(): checkpoint_bytes(cp)}
            if vocab_size < 1:
                log.warning(
                    "draft vocabulary: the model's vocabulary size is unknown (no --model or --vocab-size), "
                    "so only %s was written; run `hsextract finalize --output %s --vocab-size V` to write "
                    "the mappings",
                    token_freq_name(self.suffix),
                    self.out,
                )
                paths = write_token_freq_only(self.out, cp.counts, suffix=self.suffix, also=also)
            else:
                sizes = resolve_sizes(self.sizes, vocab_size)
                for d in sizes:
                    if d.clamped:
                        log.warning("%s", clamp_message(d, vocab_size))
                paths = write_vocab_files(
                    self.out, cp.counts, vocab_size, sizes, suffix=self.suffix, covered=cp.covered, also=also
                )
            self._saved_covered, self._saved_at = cp.covered, time.monotonic()
        return paths

    def verify(self, entries: Sequence[ManifestEntry]) -> list[str]:
        """Recount every entry from its file; the problems found with the counts and token_freq, if any."""
        truth = recount(self.out, self.fmt, entries, self.tokens)
        counts, covered = self.snapshot()
        problems = []
        if self.discarded:
            problems.append(
                f"the draft vocabulary's counts checkpoint could not be used ({self.discarded}); "
                "the counts were recounted from the files"
            )
        diff = counts.difference(truth)
        if diff:
            shown = ", ".join(f"id {i}: counted {a}, files {b}" for i, a, b in diff)
            problems.append(
                f"draft vocabulary counts differ from a recount of the training set's files ({shown}); remove "
                f"{vocab_checkpoint_path(self.out)} and run `hsextract finalize` to recount from the files"
            )
        summary = read_summary(self.out)
        freq = self.out / token_freq_name(self.suffix)
        if summary is not None and summary.get("samples") == len(entries) and freq.exists():
            diff = read_token_freq(freq).difference(truth)
            if diff:
                shown = ", ".join(f"id {i}: file {a}, recount {b}" for i, a, b in diff)
                problems.append(
                    f"{freq} differs from a recount of the training set's files ({shown}); "
                    "run `hsextract finalize` to rewrite it"
                )
        if covered != len(entries):
            problems.append(f"draft vocabulary counts cover {covered} samples, the manifest has {len(entries)}")
        return problems


def print_recount_verdict(tracker: VocabTracker, entries: Sequence[ManifestEntry], of: str) -> int:
    """`finalize --verify`'s lines on the draft vocabulary: each problem of ``tracker``'s counts
    against a recount of the samples' ``of`` (files, objects), then the totals; how many problems."""
    tracker.recover(entries, save=False)
    problems = tracker.verify(entries)
    for problem in problems:
        print(f"BAD {problem}")
    counts, _ = tracker.snapshot()
    print(
        f"draft vocabulary: {counts.total} loss-masked tokens of {counts.distinct} distinct ids "
        f"{'differ from' if problems else 'equal'} a recount of the {len(entries)} samples' {of}"
    )
    return len(problems)
