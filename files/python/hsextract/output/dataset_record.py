"""Which dataset an output directory's training set is extracted from, and the refusal to resume it
from another one.

The client resumes by dataset index: it skips every index already in the manifest. An index is a
position, not a sample, so an output extracted from one dataset and then pointed at another (the
source dataset first, the regenerated one after it; any dataset at an old output) would report
"done" with the first dataset's samples under the second's indices, silently. So the client
records the dataset in ``<output>/.hsextract/dataset.json`` before it sends anything, and a later
run whose dataset is not that one is refused before it sends anything.

"That one" means: every index already extracted still names the same row. That holds for the same
bytes at another path (moved, renamed) and for a dataset that grew at its end (rows appended to
the last file, files added after the last in reading order), and it fails for a dataset whose rows
differ. A digest of the whole dataset fits neither way: hours for a TB dataset, and different after
every append. The head digest is instead, for each of the first `HEAD_FILES` files in
reading order (`dataset_files`): its name relative to the dataset path (the names order the files,
so they order the indices; a single file's own name is not kept, as renaming it changes no index),
the length of its head (the first `HEAD_BYTES`, or all of a shorter file) and the sha256 of that
head. A later dataset is the same when its first files have the same names and the same bytes over
the recorded head lengths: an append changes neither, another dataset differs at its first row.
It costs at most a few MiB read at start. A row edited in place past a file's first MiB, or in a
later file, is not noticed: this tells datasets apart, it does not audit edits.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hsextract.dataset.sources import dataset_files
from hsextract.durable import atomic_write_json
from hsextract.errors import ConfigError
from hsextract.output.layout import dataset_record_path

log = logging.getLogger("hsextract.client")

METHOD = "sha256-of-heads-v1"
HEAD_FILES = 4
HEAD_BYTES = 1 << 20


def _head(path: Path, limit: int) -> tuple[int, str]:
    """(bytes read, sha256 hex) of the first `limit` bytes of a file (fewer if it is shorter)."""
    digest, read = hashlib.sha256(), 0
    with path.open("rb") as f:
        while read < limit:
            chunk = f.read(min(1 << 16, limit - read))
            if not chunk:
                break
            digest.update(chunk)
            read += len(chunk)
    return read, digest.hexdigest()


def head_digest(dataset: Path) -> dict[str, Any]:
    """The dataset's head digest (see the module's docstring): what tells it from another dataset."""
    single = not Path(dataset).is_dir()
    heads = []
    for f in dataset_files(dataset)[:HEAD_FILES]:
        n, sha = _head(f.path, HEAD_BYTES)
        heads.append({"name": None if single else f.name, "bytes": n, "sha256": sha})
    return {"method": METHOD, "files": heads}


def difference(recorded: dict[str, Any], dataset: Path) -> str | None:
    """How `dataset` differs from the one `recorded` fingerprints; None when it is that dataset,
    maybe moved or grown at its end. KeyError/TypeError on a malformed fingerprint."""
    single = not Path(dataset).is_dir()
    files = dataset_files(dataset)
    heads = recorded["files"]
    if len(files) < len(heads):
        return f"it has {len(files)} file(s), the recorded dataset had at least {len(heads)}"
    for i, (head, f) in enumerate(zip(heads, files, strict=False)):
        name = None if single else f.name
        if name != head["name"]:
            return f"its file number {i + 1} in reading order is {name!r}, the recorded dataset's was {head['name']!r}"
        n, sha = _head(f.path, int(head["bytes"]))
        if n < head["bytes"]:
            return f"{f.name} is {n} bytes long, shorter than the {head['bytes']} recorded of it"
        if sha != head["sha256"]:
            return f"the first {head['bytes']} bytes of {f.name} differ"
    return None


def describe(dataset: Path) -> dict[str, Any]:
    """The record of `dataset` as this run would write it."""
    return {
        "path": os.path.abspath(dataset),  # as the run was given it (what the Ansible roles compare with)
        "resolved": os.path.realpath(dataset),
        "fingerprint": head_digest(dataset),  # the record's key since its first version
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def read_record(output: Path) -> dict[str, Any] | None:
    """The output's record of its dataset; None when it has none (new, or made by an older hsextract)."""
    path = dataset_record_path(output)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path}: unreadable ({exc}); it records which dataset the training set in {output} was "
            "extracted from. Restore it, or extract into a new --output"
        ) from exc
    if not isinstance(record, dict) or not isinstance(record.get("fingerprint"), dict):
        raise ConfigError(f"{path}: not a record of a dataset; restore it, or extract into a new --output")
    return record


def check_and_record(output: Path, dataset: Path, *, has_samples: bool) -> None:
    """Refuse `dataset` if the output was extracted from another one; else record it (first run,
    an output of an older hsextract, or the same dataset moved or grown). Nothing in the output
    changes on a refusal."""
    path = dataset_record_path(output)
    recorded = read_record(output)
    if recorded is None:
        if has_samples:
            log.info(
                "output directory %s has a training set but no record of its dataset (an older hsextract made "
                "it): recording this run's dataset %s as its dataset in %s",
                output,
                dataset,
                path,
            )
        atomic_write_json(path, describe(dataset))
        return
    fp = recorded["fingerprint"]
    if fp.get("method") != METHOD:
        raise ConfigError(
            f"{path}: fingerprint method {fp.get('method')!r}, this hsextract knows {METHOD!r} only; "
            "run the hsextract that made this output, or extract into a new --output"
        )
    try:
        why = difference(fp, dataset)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{path}: malformed fingerprint ({exc!r}); restore it, or extract into a new --output"
        ) from exc
    before = recorded.get("path", "?")
    if why is not None:
        raise ConfigError(
            f"output directory {output} was extracted from the dataset {before} (recorded in {path} at "
            f"{recorded.get('recorded_at', '?')}), but this run reads the dataset {os.path.abspath(dataset)}, which is "
            f"another dataset: {why}. The client resumes by sample index, so it would skip every index already "
            f"extracted and keep {before}'s samples under them. Extract this dataset into a new --output "
            f"(hsextract_output_dir under Ansible), or run with the original dataset {before}. "
            f"Nothing in {output} was changed"
        )
    now = describe(dataset)
    if (now["path"], now["fingerprint"]) != (before, fp):
        if now["path"] != before:
            log.info(
                "dataset %s is the one output directory %s was extracted from at %s (the same rows); recording "
                "its new path",
                now["path"],
                output,
                before,
            )
        atomic_write_json(path, now)
