"""A model directory's fingerprint: its weights, its tokenizer and its chat template, each a digest.

Samples of one training set must come from one model. ``config.json`` alone does not say which:
two checkpoints of one architecture (a stale copy on one host, another revision, a fine-tune) have
the same config and other weights, and their hidden states are not interchangeable. So the drain
records this fingerprint in the manifest header, and collect refuses a host output whose
fingerprint differs from the others' (hsextract.collect.identity), naming the part.

Three parts, each a sha256 over what it covers, so a refusal can say which part differs:

* **weights**: the files SGLang can load weights from (``*.safetensors``, ``*.bin``, ``*.pt``,
  ``*.pth``, and their ``*.index.json``), at the top of the directory. For each, its name and size,
  and then:

  - a file under `SMALL_FILE` (64 MiB: every tiny test model, every index): its whole content;
  - a larger safetensors file: its header (the 8-byte length and the JSON that holds every
    tensor's name, dtype, shape and offsets) and `BLOCKS` blocks of `BLOCK` bytes spread evenly over
    the rest;
  - a larger file of another kind: the same blocks over the whole file.

  Hashing the weights whole would read the model again on every drain start: a 1 TB model at
  2 GB/s is 8 minutes, on a host whose server read it minutes ago. Names, sizes and headers are
  read in milliseconds and tell apart another sharding, dtype, quantization or architecture, but
  not a checkpoint of the same shapes (a revision, a fine-tune), whose headers are equal. The
  blocks tell those apart: another checkpoint differs in nearly every tensor, so a block anywhere
  in a file differs; a change confined to a few tensors (a merged adapter) may fall between one
  file's blocks but not between every file's. This costs `BLOCKS` x `BLOCK` = 512 KiB read per
  weight file (about 80 MiB for a 160-file model). It does not prove two directories equal byte
  for byte; it tells different models apart, which is what a refusal needs.

* **tokenizer**: the tokenizer's files (``tokenizer.json``, ``tokenizer.model``, ``vocab.*``,
  ``merges.txt``, ``*.tiktoken``, ``special_tokens_map.json``, ``added_tokens.json``) whole, and
  ``tokenizer_config.json`` without its ``chat_template`` key (that is the template's part).
* **chat template**: ``chat_template.jinja``, ``chat_template.json``, the files of
  ``additional_chat_templates/`` and the ``chat_template`` key of ``tokenizer_config.json``.

A file's name is part of its part's digest, so a renamed or missing file changes it. A model given
by a hub name rather than a directory has no fingerprint (an empty dict): nothing to read.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

METHOD = "hsextract-model-v1"
PARTS = ("weights", "tokenizer", "chat_template")
PART_NAMES = {"weights": "weights", "tokenizer": "tokenizer", "chat_template": "chat template"}

SMALL_FILE = 64 << 20  # hashed whole below this size
BLOCKS = 8  # blocks sampled from a larger weight file, spread evenly
BLOCK = 64 << 10
SAFETENSORS_MAX_HEADER = 100 << 20  # the safetensors format's own limit

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
TOKENIZER_NAMES = (
    "tokenizer.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_NAMES = ("chat_template.jinja", "chat_template.json")
CHAT_TEMPLATE_DIR = "additional_chat_templates"


class _Digest:
    """A sha256 over (name, bytes) records, each framed by its lengths so no two sequences collide."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def add(self, name: str, data: bytes) -> None:
        raw = name.encode()
        self._h.update(struct.pack("<QQ", len(raw), len(data)) + raw + data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _files(model: Path) -> list[Path]:
    return sorted((p for p in model.iterdir() if p.is_file()), key=lambda p: p.name)


def is_weight_file(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES) or (name.endswith(".index.json") and any(s in name for s in WEIGHT_SUFFIXES))


def _is_tokenizer_file(name: str) -> bool:
    return name in TOKENIZER_NAMES or name.endswith(".tiktoken") or name.startswith("vocab.")


def _blocks(f: Any, start: int, end: int) -> Iterable[bytes]:
    """`BLOCKS` blocks of up to `BLOCK` bytes spread evenly over [start, end), the last one ending at `end`."""
    span = max(0, end - start)
    if span == 0:
        return
    step = max(0, span - BLOCK) / max(1, BLOCKS - 1)
    for k in range(BLOCKS):
        f.seek(start + int(k * step))
        yield f.read(min(BLOCK, span))


def weight_file_digest(path: Path) -> bytes:
    """What of one weight file goes into the weights' digest (see the module docstring)."""
    size = path.stat().st_size
    h = hashlib.sha256(struct.pack("<Q", size))
    with open(path, "rb") as f:
        if size < SMALL_FILE:
            while chunk := f.read(1 << 20):
                h.update(chunk)
            return h.digest()
        start = 0
        if path.name.endswith(".safetensors"):
            head = f.read(8)
            (n,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
            if 0 < n <= min(SAFETENSORS_MAX_HEADER, size - 8):
                h.update(head + f.read(n))
                start = 8 + n
        for block in _blocks(f, start, size):
            h.update(block)
    return h.digest()


def _template_from_config(config: bytes) -> tuple[bytes, bytes]:
    """(tokenizer_config.json without its chat template, the chat template) as bytes to hash; a
    file that is not a JSON object goes whole to the tokenizer."""
    try:
        obj = json.loads(config)
    except ValueError:
        return config, b""
    if not isinstance(obj, dict):
        return config, b""
    template = obj.pop("chat_template", None)
    rest = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return rest, b"" if template is None else json.dumps(template, sort_keys=True).encode()


def model_fingerprint(model_path: str | Path) -> dict[str, str]:
    """The fingerprint of the model directory `model_path`: {"method", "weights", "tokenizer",
    "chat_template"} (hex digests); {} when it is not a directory. OSError when a file cannot be read."""
    model = Path(model_path)
    if not str(model_path) or not model.is_dir():
        return {}
    weights, tokenizer, template = _Digest(), _Digest(), _Digest()
    for p in _files(model):
        name = p.name
        if is_weight_file(name):
            weights.add(name, weight_file_digest(p))
        elif _is_tokenizer_file(name):
            tokenizer.add(name, p.read_bytes())
        elif name == TOKENIZER_CONFIG:
            rest, inline = _template_from_config(p.read_bytes())
            tokenizer.add(name, rest)
            if inline:
                template.add(f"{name}:chat_template", inline)
        elif name in CHAT_TEMPLATE_NAMES:
            template.add(name, p.read_bytes())
    extra = model / CHAT_TEMPLATE_DIR
    if extra.is_dir():
        for p in _files(extra):
            template.add(f"{CHAT_TEMPLATE_DIR}/{p.name}", p.read_bytes())
    return {
        "method": METHOD,
        "weights": weights.hexdigest(),
        "tokenizer": tokenizer.hexdigest(),
        "chat_template": template.hexdigest(),
    }


def differing_parts(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The parts (of `PARTS`) in which two recorded fingerprints differ; ["method"] when they were
    taken by different methods (their digests cannot be compared)."""
    if a.get("method") != b.get("method"):
        return ["method"]
    return [p for p in PARTS if a.get(p) != b.get(p)]
