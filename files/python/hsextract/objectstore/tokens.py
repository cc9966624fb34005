"""A sample's token ids and loss mask, read back from its object.

What the dataset-level files (speculators' Arrow dataset) and the draft vocabulary's recount need
of each sample: not its hidden states. A safetensors sample gives them with two ranged reads
(its header, then the ids and mask at the end of the file); a ``torch.save`` sample is fetched
into a temporary file and read by the format's own reader.
"""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path
from typing import Any

from hsextract.objectstore.store import ObjectStore, StoreError
from hsextract.output.manifest import ManifestEntry

_DTYPE_BYTES = {"I64": 8}


class RemoteTokens:
    """``(input_ids, loss_mask)`` of a set's samples in a bucket, for a format's readers."""

    def __init__(self, store: ObjectStore, fmt: Any, tmp_dir: Path | None = None):
        self.store, self.fmt, self.tmp_dir = store, fmt, tmp_dir

    def __call__(self, entry: ManifestEntry) -> tuple[Any, Any]:
        if entry.file.endswith(".safetensors"):
            return self._safetensors(entry)
        return self._whole(entry)

    def _safetensors(self, entry: ManifestEntry) -> tuple[Any, Any]:
        import torch

        key = self.store.url.key(entry.file)
        first = self.store.get_bytes(key, 0, 65535)
        if first is None or len(first) < 8:
            raise StoreError(f"{self.store.url}/{entry.file}: missing or shorter than a safetensors header")
        (n,) = struct.unpack("<Q", first[:8])
        head = first[8 : 8 + n] if 8 + n <= len(first) else self.store.get_bytes(key, 8, 7 + n) or b""
        meta = json.loads(head)
        base = 8 + n
        out = []
        for name in ("token_ids", "loss_mask"):
            t = meta[name]
            a, b = t["data_offsets"]
            data = self.store.get_bytes(key, base + a, base + b - 1) if b > a else b""
            out.append(
                torch.frombuffer(bytearray(data), dtype=torch.int64) if data else torch.zeros(0, dtype=torch.int64)
            )
        return out[0], out[1]

    def _whole(self, entry: ManifestEntry) -> tuple[Any, Any]:
        with tempfile.TemporaryDirectory(dir=self.tmp_dir) as d:
            path = Path(d) / Path(entry.file).name
            self.store.download(self.store.url.key(entry.file), path)
            return self.fmt.read_tokens(path)

    def rows(self, entry: ManifestEntry) -> tuple[list[int], list[int]]:
        ids, mask = self(entry)
        return ids.tolist(), mask.tolist()
