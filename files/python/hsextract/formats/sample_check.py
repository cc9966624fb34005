"""Is a manifest row's file that row's sample? What collect and ``finalize --verify`` check beyond
the file's size and checksum.

A size and a checksum prove only that a file is the one its row recorded. A row edited (or
damaged) to name another sample's file, with that file's size and checksum, passes both; so
does a row whose file was swapped with another's. So each row is also held to:

* its name: the file of output index i is the format's name for i, and nothing else (a plain
  relative path inside the set, hsextract.contained; a row naming ``../x`` or ``/etc/x`` is not
  read at all);
* its shapes: every tensor holds the row's token count, and the set's aux layers and hidden size
  (the manifest header's);
* its dataset index, where the file keeps one (ModelOpt's ``conversation_id``);
* its fingerprint (hsextract.fingerprint): recomputed from the file's rows and token ids, a piece at
  a time, where the row holds one of the definition this code computes. Every format keeps every
  staged row unchanged (speculators as one tensor, the others in groups of slots), so the rows the
  drain fingerprinted can always be put back together;
* an FP8 set's rows (hsextract.fp8) are not the staged rows: the drain checked those against the
  capture's fingerprint before it quantized them, and records the fingerprint of what it stores,
  each token's FP8 row followed by its float32 scale, by the same definition; so that is what is
  recomputed here, and each scale must be a finite number above 0.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from hsextract import fingerprint, fp8
from hsextract.contained import UnsafePath, checked_parts, fd_path, open_regular
from hsextract.formats.base import SampleShape
from hsextract.formats.stored import StoredSample
from hsextract.output.manifest import ManifestEntry, ManifestHeader, fd_problem

# Rows whose fingerprint is recomputed at once: bounds the memory a check takes (rows of a large
# model are tens of kB each, and a row group is copied once to put its slots back together).
_PIECE = 64 << 20


class SampleCheck:
    """The checks of one set's rows (one format, one manifest header)."""

    def __init__(self, fmt, header: ManifestHeader):
        self.fmt = fmt
        self.header = header

    def name_problem(self, entry: ManifestEntry) -> str | None:
        """Why the row's file is not its own by name, else None (UnsafePath, raised, for a name that
        is no plain path inside the set)."""
        checked_parts(entry.file)
        own = self.fmt.relative_path(entry.output_index)
        if entry.file != own:
            return f"the row names {entry.file!r}, but sample {entry.output_index}'s file is {own!r}"
        return None

    def content_problem(self, path: Path, entry: ManifestEntry) -> str | None:
        """Why the file at `path` does not hold the row's sample, else None."""
        try:
            stored = self.fmt.read_stored(path)
            return self._stored_problem(stored, entry)
        except Exception as exc:  # torch, safetensors and numpy raise many kinds on a file of another layout
            return f"not readable as a {self.fmt.name} sample ({type(exc).__name__}: {str(exc)[:200]})"

    def checks_fingerprint(self, entry: ManifestEntry) -> bool:
        """Whether the row holds a fingerprint this code can recompute (one of its definition)."""
        return bool(entry.fingerprint) and fingerprint.version_of(entry.fingerprint) == fingerprint.VERSION

    def _stored_problem(self, stored: StoredSample, entry: ManifestEntry) -> str | None:
        tokens = len(stored.input_ids)
        if tokens != entry.tokens:
            return f"its file holds {tokens} tokens, the row says {entry.tokens}"
        shape = SampleShape(entry.tokens, self.header.num_aux, self.header.hidden_size, stored_dtype(self.header))
        want = self.fmt.stored_shapes(shape)
        if stored.shapes != want:
            return f"its tensors have the shapes {stored.shapes}, a sample of {entry.tokens} tokens of this set {want}"
        if (stored.scales is not None) != (self.header.precision == "fp8"):
            held = "FP8" if stored.scales is not None else "unscaled"
            return f"its file holds {held} rows, the set's are {self.header.precision}"
        if stored.scales is not None:
            import torch

            problem = fp8.scales_problem(torch.from_numpy(np.array(stored.scales())), entry.tokens)
            if problem:
                return f"its FP8 rows cannot be read back: {problem}"
        if stored.dataset_index is not None and stored.dataset_index != entry.dataset_index:
            return f"its file holds dataset index {stored.dataset_index}, the row says {entry.dataset_index}"
        if self.checks_fingerprint(entry):
            got = recomputed_fingerprint(stored)
            if got != entry.fingerprint:
                return f"its rows have fingerprint {got}, the row says {entry.fingerprint}: another sample's rows"
        return None

    def verify_row(self, out: Path, entry: ManifestEntry) -> str | None:
        """Everything wrong with row `entry` of the set `out` (its name, size, checksum, contents), or None.
        The file is opened once, as a regular file inside `out` (no link followed), and read through
        that descriptor only."""
        try:
            problem = self.name_problem(entry)
            if problem:
                return problem
            fd = open_regular(out, entry.file)
        except FileNotFoundError:
            return f"{out / entry.file}: missing"
        except (OSError, UnsafePath) as exc:  # UnsafePath says why the file is not read
            return f"{out}: {exc}"
        try:
            found = fd_problem(fd, out / entry.file, entry)
            if found:
                return found[1]
            return self.content_problem(fd_path(fd), entry)
        finally:
            os.close(fd)


def stored_dtype(header: ManifestHeader):  # -> torch.dtype
    """The dtype of a set's stored rows: float8_e4m3fn for an FP8 set, else the captured dtype."""
    import torch

    from hsextract.staging.dumps import DTYPES

    if header.precision == "fp8":
        return fp8.DTYPE
    return DTYPES[header.dtype][0] if header.dtype in DTYPES else torch.bfloat16


def recomputed_fingerprint(stored: StoredSample) -> str:
    """The fingerprint (hsextract.fingerprint) of the rows and token ids a file holds, as text."""
    ids = np.asarray(stored.input_ids, dtype=np.int64)
    pieces = stored.pieces()
    row_bytes = sum(int(p.shape[1]) for p in pieces)
    step = max(1, _PIECE // max(1, row_bytes))
    total = 0
    for a in range(0, len(ids), step):
        b = min(len(ids), a + step)
        rows = np.concatenate([p[a:b] for p in pieces], axis=1) if len(pieces) > 1 else pieces[0][a:b]
        values = fingerprint.row_values_np(np.ascontiguousarray(rows), ids[a:b], row_bytes)
        total = fingerprint.add(total, fingerprint.combine(values, a))
    return fingerprint.to_text(total)
