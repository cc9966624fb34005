"""Dataset files of every shape users have, read as one stream of rows that know where they came from.

A dataset path is a file or a directory:

* JSON Lines: ``.jsonl``, ``.ndjson``, and any file of another name (one JSON value per line;
  every line is a row, blank ones too, so a row number is the line number);
* a JSON array (``.json`` whose first character is ``[``; a ``.json`` file of lines is read as
  lines): streamed element by element, never loaded whole (ShareGPT's original files are GBs);
* any of those compressed: ``.gz``, ``.zst`` (needs the ``zstandard`` package);
* Parquet (``.parquet``) and Arrow IPC files or streams (``.arrow``, ``.feather``);
* a ``datasets`` ``save_to_disk`` directory (``state.json`` lists its Arrow files);
* a directory of any of these, read in sorted order of their paths (hidden names, those starting
  with ``.`` or ``_``, and files of other suffixes are skipped and logged).

Rows come out in file order, then row order, so a sample's index is stable. A part of a file
that cannot be read (a corrupt compressed stream, a broken Parquet page) becomes `Unreadable`
rows, never an exception: `count_rows` counts them exactly as `iter_rows` yields them.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from hsextract.dataset.json_array import ArrayScan, NotAnElement
from hsextract.errors import HsextractError

log = logging.getLogger("hsextract.dataset")

BLOCK = 1 << 20
BOM = b"\xef\xbb\xbf"
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
LINE_SUFFIXES = (".jsonl", ".ndjson")
TABLE_SUFFIXES = {".parquet": "parquet", ".arrow": "arrow", ".feather": "arrow"}
KNOWN = (*LINE_SUFFIXES, ".json", *TABLE_SUFFIXES)

# Reasons of unreadable rows (the reader turns them into rejects); a JSON array's are its scanner's.
UNREADABLE_FILE = "unreadable_file"


@dataclass(frozen=True)
class Unreadable:
    """Part of a file that could not be read as rows."""

    reason: str
    detail: str


@dataclass(frozen=True)
class Row:
    """One row of a dataset file: JSON text (text formats), a decoded row (tables), or Unreadable."""

    file: str  # the file's path relative to the dataset path (its name for a single file)
    row: int  # 0-based position in the file: the line of a JSONL file, the element of an array
    data: bytes | Mapping | Unreadable


@dataclass(frozen=True)
class DataFile:
    path: Path
    name: str
    kind: str  # "text" (JSON lines or a JSON array), "parquet", "arrow"
    compression: str | None = None


# -- which files --------------------------------------------------------------------------------


def _describe(path: Path) -> tuple[str, str | None] | None:
    """(kind, compression) of a file by its name; None for a name no dataset file has."""
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    inner = (
        suffixes[-2]
        if compression and len(suffixes) == 2
        else (None if compression else (suffixes[-1] if suffixes else None))
    )
    if inner in TABLE_SUFFIXES and not compression:
        return TABLE_SUFFIXES[inner], None
    if inner in (*LINE_SUFFIXES, ".json"):
        return "text", compression
    return None


def _check_codec(compression: str | None, path: Path) -> None:
    if compression == "zstd":
        try:
            import zstandard  # noqa: F401
        except ImportError:
            raise HsextractError(
                f"dataset file {path} is zstd-compressed, but the zstandard package is not installed in this "
                "environment; install it (pip install zstandard) or decompress the file (zstd -d)"
            ) from None


def _save_to_disk_files(d: Path, prefix: str) -> list[DataFile]:
    try:
        state = json.loads((d / "state.json").read_text())
        names = [f["filename"] for f in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HsextractError(
            f"{d}: state.json does not list the data files of a saved dataset ({exc}); "
            "is it a directory written by datasets' save_to_disk?"
        ) from exc
    return [DataFile(d / n, f"{prefix}{n}", "arrow") for n in names]


def _walk(d: Path, prefix: str, out: list[DataFile], ignored: list[str], hidden: list[str]) -> None:
    if (d / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in d.iterdir() if (p / "state.json").is_file())
        raise HsextractError(
            f"{d} holds a DatasetDict (splits {', '.join(splits) or 'none'}); "
            f"pass one split's directory, e.g. {d / (splits[0] if splits else 'train')}"
        )
    if (d / "state.json").is_file() and (d / "dataset_info.json").is_file():
        out.extend(_save_to_disk_files(d, prefix))
        return
    for child in sorted(d.iterdir(), key=lambda p: p.name):
        rel = f"{prefix}{child.name}"
        if child.name.startswith((".", "_")):
            hidden.append(rel)
            continue
        if child.is_dir():
            _walk(child, rel + "/", out, ignored, hidden)
        elif (desc := _describe(child)) is not None:
            _check_codec(desc[1], child)
            out.append(DataFile(child, rel, *desc))
        else:
            ignored.append(rel)


def _names(names: list[str]) -> str:
    return ", ".join(names[:10]) + (" ..." if len(names) > 10 else "")


def _empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False  # an unreadable file is reported by its reader


# What a process has said about the files of a dataset directory it skips: a plan or a run lists
# the directory several times (the reader, the row count, the fingerprint, the scan's key), and
# says it once.
_said: set[tuple[str, str, tuple[str, ...]]] = set()
_said_lock = threading.Lock()


def _say_once(directory: Path, message: str, names: list[str]) -> None:
    key = (str(directory), message, tuple(names))
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    log.info("dataset %s: " + message, directory, len(names), _names(names))


def dataset_files(path: str | Path) -> list[DataFile]:
    """The files of a dataset path, in reading order; HsextractError saying what to pass when unusable.

    A dataset with nothing in it (a directory without dataset files, or whose files are all empty,
    or an empty file) is refused: a run of 0 samples that ends "done" looks like a success and
    hides a wrong path or a failed copy.
    """
    p = Path(path)
    if p.is_dir():
        out: list[DataFile] = []
        ignored: list[str] = []
        hidden: list[str] = []
        _walk(p, "", out, ignored, hidden)
        if hidden:
            _say_once(p, "skipping %d hidden files and directories (names starting with . or _): %s", hidden)
        if ignored:
            _say_once(p, "skipping %d files of no dataset format: %s", ignored)
        if not out:
            raise HsextractError(
                f"dataset directory {p} has no dataset files ({', '.join(KNOWN)}, "
                "optionally .gz or .zst, or a save_to_disk directory)"
            )
        if all(_empty(f.path) for f in out):
            raise HsextractError(
                f"dataset directory {p}: its dataset files are all empty (0 bytes: "
                f"{_names([f.name for f in out])}); pass --dataset with the data"
            )
        return out
    if not p.exists():
        raise HsextractError(f"dataset {p} does not exist; pass --dataset with a dataset file or directory")
    try:
        with p.open("rb"):
            pass
    except OSError as exc:
        raise HsextractError(f"dataset {p}: cannot open ({exc})") from exc
    if _empty(p):
        raise HsextractError(
            f"dataset file {p} is empty (0 bytes); pass --dataset with the data (was it copied completely?)"
        )
    kind, compression = _describe(p) or ("text", None)
    _check_codec(compression, p)
    return [DataFile(p, p.name, kind, compression)]


# -- text files: JSON lines and JSON arrays -------------------------------------------------------


# Compressed input is fed to the decompressor in pieces this large, which bounds what one call
# returns (gzip's ratio is at most about 1000:1) as the 1 MiB blocks bound plain reads.
INFLATE_PIECE = 64 << 10


class TruncatedStream(EOFError):
    """A compressed file ends inside a member (gzip) or frame (zstd): everything before was read."""


def _decompressor(compression: str) -> Any:
    if compression == "gzip":
        import zlib

        return zlib.decompressobj(wbits=31)  # a gzip member, header and checksum checked
    import zstandard

    return zstandard.ZstdDecompressor().decompressobj()


def _inflate(fh: BinaryIO, compression: str) -> Iterator[bytes]:
    """The decompressed bytes of a gzip or zstd file, each piece as soon as it is decompressed.

    ``gzip.open`` raises at a truncated end and throws away what that last read had decompressed
    (up to a whole 1 MiB block: a small file's every row), and zstd's stream reader ends a
    truncated file silently. Here everything decompressed is yielded first, then a truncated end
    raises `TruncatedStream`. Files of several gzip members or zstd frames are read whole (and
    the zero bytes gzip allows after a member are skipped), as ``gzip`` and ``zstd -d`` do.
    """
    d: Any = None
    while block := fh.read(INFLATE_PIECE):
        data = block
        while data:
            if d is None:  # a new member or frame starts here
                data = data.lstrip(b"\0") if compression == "gzip" else data
                if not data:
                    break
                d = _decompressor(compression)
            out = d.decompress(data)
            data = b""
            if out:
                yield out
            if d.eof:
                data, d = d.unused_data, None
    if d is not None:
        raise TruncatedStream("the compressed data ends before its end marker (is the file truncated?)")


def _blocks(f: DataFile) -> Iterator[bytes]:
    """The (decompressed) bytes of a file in blocks, the leading byte-order mark dropped."""
    with f.path.open("rb") as fh:
        source: Iterator[bytes] = _inflate(fh, f.compression) if f.compression else iter(lambda: fh.read(BLOCK), b"")
        first = True
        head = b""
        for block in source:
            if first:
                head += block  # a stream may return short pieces: the mark may span two
                if len(head) < len(BOM):
                    continue
                block, head, first = head[len(BOM) :] if head.startswith(BOM) else head, b"", False
            yield block
        if first and head:  # shorter than a byte-order mark
            yield head


# What an unreadable part of a file means for the rows after it: where the rows cannot be counted
# (a compressed stream cut short, a JSON array, an Arrow stream), one reject stands for them all.
REST_UNKNOWN = "the rows after it are lost, and how many is unknown: this one reject stands for them all"


def _unreadable(f: DataFile, exc: BaseException, where: str, rest: str = REST_UNKNOWN) -> Unreadable:
    return Unreadable(
        UNREADABLE_FILE, f"{f.name}: cannot read {where} ({type(exc).__name__}: {str(exc)[:200]}); {rest}"
    )


def _first_byte(f: DataFile) -> bytes:
    """The first non-blank byte of a text file ('' for an empty or unreadable one)."""
    try:
        for block in _blocks(f):
            stripped = block.lstrip()
            if stripped:
                return stripped[:1]
    except Exception:  # the row reader reports it
        return b""
    return b""


def _lines(f: DataFile) -> Iterator[bytes | Unreadable]:
    parts: list[bytes] = []
    n = 0
    try:
        for block in _blocks(f):
            if b"\n" not in block:
                parts.append(block)
                continue
            pieces = block.split(b"\n")
            parts.append(pieces[0])
            yield b"".join(parts)
            n += 1
            for piece in pieces[1:-1]:
                yield piece
                n += 1
            parts = [pieces[-1]]
    except Exception as exc:  # a corrupt or truncated compressed stream, a vanished file
        yield _unreadable(f, exc, f"past line {n}")
        return
    if any(parts):
        yield b"".join(parts)


def _count_lines(f: DataFile) -> int:
    n, last = 0, b"\n"
    try:
        for block in _blocks(f):
            n += block.count(b"\n")
            last = block[-1:] or last  # an empty block (a lone byte-order mark) ends no line
    except Exception:  # _lines yields one Unreadable row for it
        return n + 1
    return n + (0 if last == b"\n" else 1)


def _array_elements(f: DataFile) -> Iterator[bytes | Unreadable]:
    """The elements of a JSON array file as their own JSON texts, read block by block (see
    `hsextract.dataset.json_array`); what is no element, or a read that fails, is an Unreadable row."""
    scan = ArrayScan(f.name)
    n = 0
    try:
        for block in _blocks(f):
            scan.append(block)
            del block
            for row in scan.scan():
                n += 1
                yield _as_row(row)
            if scan.ended:
                return
    except Exception as exc:
        yield _unreadable(f, exc, f"the JSON array past element {n}")
        return
    for row in scan.finish():
        yield _as_row(row)


def _as_row(part: bytes | NotAnElement) -> bytes | Unreadable:
    return part if isinstance(part, bytes) else Unreadable(part.reason, part.detail)


def _text_rows(f: DataFile) -> Iterator[bytes | Unreadable]:
    return _array_elements(f) if _first_byte(f) == b"[" else _lines(f)


def _count_text(f: DataFile) -> int:
    if _first_byte(f) == b"[":
        return sum(1 for _ in _array_elements(f))
    return _count_lines(f)


# -- tables: Parquet, Arrow ---------------------------------------------------------------------------


def _parquet_rows(f: DataFile) -> Iterator[Mapping | Unreadable]:
    """Rows of a Parquet file: exactly as many as its metadata says, which is what `_count_parquet` counts."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f.path)
        total = int(pf.metadata.num_rows)
    except Exception as exc:  # not Parquet, or its footer is damaged: one row says so
        yield _unreadable(
            f,
            exc,
            "its metadata",
            "none of its rows can be read, and how many there are is unknown: this one reject stands for them all",
        )
        return
    done = 0
    try:
        for batch in pf.iter_batches(batch_size=256):
            for row in batch.to_pylist():
                if done == total:
                    log.warning("%s: more rows than its metadata says; the extra rows are skipped", f.name)
                    return
                yield row
                done += 1
    except Exception as exc:  # a damaged page: its rows and the rest become rejects
        bad = _unreadable(
            f,
            exc,
            f"past row {done}",
            f"the {total - done} rows from there on are lost (one reject each: the metadata counts them)",
        )
        if done == total:
            log.warning("%s", bad.detail)
        for _ in range(total - done):
            yield bad
        return
    for _ in range(total - done):
        yield Unreadable(UNREADABLE_FILE, f"{f.name}: the file holds fewer rows than its metadata says")


def _count_parquet(f: DataFile) -> int:
    import pyarrow.parquet as pq

    try:
        return int(pq.ParquetFile(f.path).metadata.num_rows)
    except Exception:  # _parquet_rows yields one Unreadable row for it
        return 1


def _arrow_batches(f: DataFile) -> Iterator:
    import pyarrow as pa

    with pa.memory_map(str(f.path)) as source:
        try:
            reader = pa.ipc.open_file(source)
        except Exception:  # not the file format: try the stream format (save_to_disk's)
            source.seek(0)
            yield from pa.ipc.open_stream(source)
            return
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


def _arrow_rows(f: DataFile) -> Iterator[Mapping | Unreadable]:
    done = 0
    try:
        for batch in _arrow_batches(f):
            rows = batch.to_pylist()
            yield from rows
            done += len(rows)
    except Exception as exc:
        yield _unreadable(f, exc, f"past row {done}")


def _count_arrow(f: DataFile) -> int:
    n = 0
    try:
        for batch in _arrow_batches(f):
            n += batch.num_rows
    except Exception:  # _arrow_rows yields one Unreadable row for it
        return n + 1
    return n


# -- the dataset ---------------------------------------------------------------------------------------


def file_rows(f: DataFile) -> Iterator[Row]:
    it: Iterator[Mapping[Any, Any] | bytes | Unreadable]
    if f.kind == "parquet":
        it = _parquet_rows(f)
    elif f.kind == "arrow":
        it = _arrow_rows(f)
    else:
        it = _text_rows(f)
    for row, data in enumerate(it):
        yield Row(f.name, row, data)


def file_row_count(f: DataFile) -> int:
    if f.kind == "parquet":
        return _count_parquet(f)
    if f.kind == "arrow":
        return _count_arrow(f)
    return _count_text(f)


def iter_rows(path: str | Path) -> Iterator[Row]:
    """Every row of the dataset at `path`, in file order then row order."""
    for f in dataset_files(path):
        yield from file_rows(f)


def count_rows(path: str | Path) -> int:
    """How many rows `iter_rows` yields (for progress and shard sizes), reading as little as it can."""
    return sum(file_row_count(f) for f in dataset_files(path))
