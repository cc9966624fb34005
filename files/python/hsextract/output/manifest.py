"""The run manifest: what an output directory holds, sample by sample.

::

    <output>/manifest.json    header, written once (atomically) before the first sample:
                              format, model path + config hash + fingerprint (weights, tokenizer,
                              chat template: hsextract.model_fingerprint), SGLang version, layer ids
                              in both conventions, final-norm placement, dtype, hidden size,
                              precision of the stored rows, checksum algorithm
    <output>/manifest.jsonl   one JSON line per written sample, appended (and fsynced) only after
                              the sample's file is durable: output index, dataset index, rid,
                              token count, file, bytes, checksum

The manifest is the single source of truth for "this sample is done": the client resumes from
`completed_indices`, the drain never writes a sample whose dataset index is already listed, and
the dataset-level files (Arrow dataset, ``sample_lengths.json``) are rebuilt from it. A line
torn by a power cut is the only damage an append can leave; readers ignore it and the drain and
collect cut it off when they start (hsextract.output.repair).
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hsextract.contained import UnsafePath, open_regular
from hsextract.durable import atomic_write_bytes, fsync_dir, write_all
from hsextract.errors import ConfigError, HsextractError
from hsextract.output.layout import manifest_entries_path as entries_path
from hsextract.output.layout import manifest_header_path as header_path

MANIFEST_VERSION = 1


class ManifestError(HsextractError):
    """The manifest of an output directory is damaged or belongs to a different configuration."""


@dataclass
class ManifestHeader:
    """What every sample of an output directory has in common (so a trainer can check it)."""

    format: str
    final_hidden: str  # "post_norm" or "pre_norm": where the last hidden state was taken
    dtype: str  # of the captured states (what the capture stages)
    hidden_size: int
    num_aux: int
    eagle_aux_hidden_state_layer_ids: list[int]
    sglang_layers_to_capture: list[int]
    num_hidden_layers: int
    # How the files store the rows (hsextract.formats.PRECISIONS): "bf16", as captured, or "fp8"
    # (hsextract.fp8: float8_e4m3fn and one float32 scale per token). A set from before it is "bf16".
    precision: str = "bf16"
    model_path: str = ""
    model_config_sha256: str = ""
    # hsextract.model_fingerprint of the model directory: {"method", "weights", "tokenizer",
    # "chat_template"}; {} where none was recorded (a model given by hub name, or an output started
    # by an hsextract before fingerprints).
    model_fingerprint: dict[str, str] = field(default_factory=dict)
    architecture: str = ""
    vocab_size: int = 0  # the model's vocabulary (config.json), for the draft vocabulary's t2d; 0 = unknown
    sglang_version: str = ""
    hsextract_version: str = ""
    run_id: str = ""
    checksum_algorithm: str = "sha256"
    created_at: float = 0.0
    version: int = MANIFEST_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ManifestHeader:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class ManifestEntry:
    """One written sample."""

    output_index: int  # position in the training set (file number, Arrow row)
    dataset_index: int  # line of the client's dataset
    rid: str
    tokens: int
    file: str  # path relative to the output directory
    bytes: int
    checksum: str  # "<algorithm>:<hex digest>" of the file's bytes
    written_at: float = 0.0
    fingerprint: str = ""  # hsextract.fingerprint of the rows as the forward pass computed them
    # The greedy self-check: "passed", "near_tie", or "" where the sample was not among those checked.
    greedy_check: str = ""
    # In a collected set (``hsextract collect``): the host output the sample came from and its
    # output index there. A drain's own manifest leaves them out of its lines (`to_line`).
    host: str = ""
    host_index: int = -1
    # In a bucket's set (hsextract.objectstore): the object's ETag as the server reported it when the
    # sample was confirmed, so a later reader tells an object replaced since by its ETag alone. A
    # directory's manifest leaves it out of its lines.
    etag: str = ""

    def to_line(self) -> builtins.bytes:  # `bytes` alone is the field above
        data = asdict(self)
        if not self.host:
            del data["host"], data["host_index"]
        if not self.etag:
            del data["etag"]
        return (json.dumps(data, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ManifestEntry:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def read_header(output_dir: str | Path) -> ManifestHeader | None:
    """The header of an output directory, or None if no sample was ever written there."""
    p = header_path(output_dir)
    try:
        return ManifestHeader.from_dict(json.loads(p.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        raise ManifestError(
            f"{p}: unreadable manifest header ({exc}); restore it or use a new output directory"
        ) from exc


def write_header(output_dir: str | Path, header: ManifestHeader) -> None:
    atomic_write_bytes(header_path(output_dir), (json.dumps(asdict(header), indent=2, sort_keys=True) + "\n").encode())


def _parse_lines(data: bytes, path: Path) -> Iterator[ManifestEntry]:
    lines = data.split(b"\n")
    # Everything after the last newline is a torn append (or nothing): not a sample.
    complete = lines[:-1]
    for n, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            yield ManifestEntry.from_dict(json.loads(line))
        except (ValueError, TypeError) as exc:
            raise ManifestError(
                f"{path}: line {n} is not a manifest entry ({exc}); the manifest is damaged beyond a torn last line"
            ) from exc


def iter_entries(output_dir: str | Path) -> Iterator[ManifestEntry]:
    """Every complete entry of the manifest, in append order (a torn last line is ignored)."""
    p = entries_path(output_dir)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return
    yield from _parse_lines(data, p)


def completed_indices(output_dir: str | Path) -> set[int]:
    """Dataset indices already written to `output_dir` (empty if nothing was written yet).

    This is what a restarted client skips: a sample is complete exactly when its manifest line
    exists, and the line is appended only after the sample's file is durable.
    """
    return {e.dataset_index for e in iter_entries(output_dir)}


def check_header_matches_fields(where: str, theirs: ManifestHeader, ours: ManifestHeader) -> None:
    """ConfigError unless two headers describe samples of one configuration: a set published in a
    bucket against the one a drain writes, or a host's set against the one collect merges it into."""
    problems = [
        f"{name} {getattr(theirs, name)!r} (this drain's: {getattr(ours, name)!r})"
        for name in ("format", "precision", "final_hidden", "dtype", "hidden_size", "eagle_aux_hidden_state_layer_ids")
        if getattr(theirs, name) != getattr(ours, name)
    ]
    if problems:
        raise ConfigError(
            f"{where} was written with "
            + "; ".join(problems)
            + ". Use the same configuration to resume, or a new prefix."
        )


class ManifestAppender:
    """Appends entries durably; an append that fails (e.g. the disk is full) leaves no partial line."""

    def __init__(self, output_dir: str | Path):
        self.path = entries_path(output_dir)
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if created:
            fsync_dir(self.path.parent)

    def append(self, entries: Iterable[ManifestEntry]) -> None:
        data = b"".join(e.to_line() for e in entries)
        if not data:
            return
        size = os.fstat(self._fd).st_size
        try:
            write_all(self._fd, [data])
            os.fsync(self._fd)
        except OSError:
            # Leave the file as it was, so the retry does not follow a half line.
            os.ftruncate(self._fd, size)
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


# --- checksums ------------------------------------------------------------------------------
# xxh3-128 runs at memory speed; sha256 (~1.4 GB/s per core) is the fallback when the xxhash
# module is absent. Each entry names its algorithm, so a manifest stays verifiable either way.


def default_checksum_algorithm() -> str:
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return "sha256"
    return "xxh3_128"


def new_hasher(algorithm: str) -> Any:
    """A hashlib-style object (update/hexdigest) for `algorithm`."""
    if algorithm == "xxh3_128":
        try:
            import xxhash
        except ImportError:
            raise ManifestError(
                "this manifest uses xxh3_128 checksums; install the 'xxhash' package to verify them"
            ) from None
        return xxhash.xxh3_128()
    if algorithm in ("sha256", "blake2b", "sha1"):
        return hashlib.new(algorithm)
    raise ManifestError(f"unknown checksum algorithm {algorithm!r}")


def checksum_file(path: str | Path, algorithm: str, block: int = 16 << 20) -> str:
    with open(path, "rb") as f:
        return checksum_fd(f.fileno(), algorithm, block)


def checksum_fd(fd: int, algorithm: str, block: int = 16 << 20) -> str:
    """The checksum of the file open as `fd`, read from its start (the descriptor's offset moves)."""
    h = new_hasher(algorithm)
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, block):
        h.update(chunk)
    return f"{algorithm}:{h.hexdigest()}"


def verify_entry(output_dir: str | Path, entry: ManifestEntry) -> str | None:
    """None if the entry's file is a regular file inside `output_dir` (reached without following a
    link: hsextract.contained) with its recorded size and checksum, else what is wrong."""
    p = Path(output_dir) / entry.file
    try:
        fd = open_regular(Path(output_dir), entry.file)
    except FileNotFoundError:
        return f"{p}: missing"
    except UnsafePath as exc:
        return f"{output_dir}: {exc}"
    try:
        problem = fd_problem(fd, p, entry)
    finally:
        os.close(fd)
    return problem[1] if problem else None


def file_problem(p: Path, entry: ManifestEntry) -> tuple[str, str] | None:
    """None if the file `p` has the size and checksum `entry` records (by the entry's own
    algorithm), else (kind, what is wrong), kind one of "missing", "size", "checksum"."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return "missing", f"{p}: missing"
    try:
        return fd_problem(fd, p, entry)
    finally:
        os.close(fd)


def fd_problem(fd: int, p: Path, entry: ManifestEntry) -> tuple[str, str] | None:
    """`file_problem` of the file open as `fd` (`p`: its name in the messages)."""
    size = os.fstat(fd).st_size
    if size != entry.bytes:
        return "size", f"{p}: {size} bytes, manifest says {entry.bytes}"
    algorithm = entry.checksum.split(":", 1)[0]
    actual = checksum_fd(fd, algorithm)
    if actual != entry.checksum:
        return "checksum", f"{p}: checksum {actual}, manifest says {entry.checksum}"
    return None
