"""Bring an output directory to a consistent state after whatever happened before (a crash, a
kill -9, a power cut), and refuse to start on a configuration that would write wrong samples.

The crash-safety argument of the drain (see hsextract.drain.core) makes every sample either
written and recorded once, or still staged. What a crash leaves behind is repaired at start:

* in the output directory, by the repair collect uses too (hsextract.output.repair): a torn last
  manifest line (a power cut mid-append) is cut off; temporary files of samples never renamed
  are removed; files at output indices the manifest has not reached (renamed, never recorded)
  are removed;
* in the staging directory, here: dump directories half deleted (renamed to a trash name) are
  deleted.

The checks refuse a staging directory that does not exist, an unwritable output directory, a
running capture whose final-norm placement the format cannot use, and an output directory
written with another format, precision, dtype, hidden size or layers.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from hsextract.drain.config import DrainConfig
from hsextract.durable import check_writable
from hsextract.errors import ConfigError
from hsextract.formats import FORMATS, check_precision
from hsextract.formats.base import OutputFormat
from hsextract.model_fingerprint import PART_NAMES, differing_parts, model_fingerprint
from hsextract.output.manifest import ManifestEntry, ManifestError, ManifestHeader, iter_entries, read_header
from hsextract.output.repair import clear_temporary, remove_orphans, repair_torn_tail
from hsextract.output.run_id import load_or_create_run_id
from hsextract.staging.announcements import live_announcements
from hsextract.staging.dumps import TRASH_PREFIX
from hsextract.staging.fs import prepare_root

log = logging.getLogger("hsextract.drain")


@dataclass
class Recovered:
    """The state of an output directory, consistent again."""

    run_id: str
    entries: list[ManifestEntry]
    header: ManifestHeader | None


def recover(cfg: DrainConfig, fmt: OutputFormat, tmp_dir: Path) -> Recovered:
    """Check the setup, repair what a crash left, and return the manifest as it now stands."""
    out, dump_dir = Path(cfg.output), Path(cfg.dump_dir)
    check_precision(cfg.format, cfg.precision)  # never a set its trainer would misread
    if not dump_dir.is_dir():
        raise ConfigError(
            f"staging directory {dump_dir} does not exist: the capture creates it when the server starts. "
            "Start the server first, or check --dump-dir (it must be the capture's dump_dir and the client's)"
        )
    prepare_root(dump_dir, create=False)  # another user's, or one others may write: refused
    check_writable(out, "output directory", "--output")
    check_captures(dump_dir, cfg.format, cfg.precision)
    run_id = load_or_create_run_id(out)
    torn = repair_torn_tail(out)
    if torn:
        log.warning("manifest: cut off a torn last line (%d bytes) left by a crash", torn)
    entries = list(iter_entries(out))
    for n, e in enumerate(entries):
        if e.output_index != n:
            raise ManifestError(
                f"{out}/manifest.jsonl: entry {n} has output index {e.output_index}; "
                "the manifest must number samples 0, 1, 2... (was it edited?)"
            )
    header = read_header(out)
    if header is not None:
        check_header_matches_config(out, header, cfg)  # a bucket's header: its work directory holds a copy
    elif entries:
        raise ManifestError(f"{out}: manifest.jsonl has entries but manifest.json is missing; restore it")
    for leftover in dump_dir.glob(f"{TRASH_PREFIX}*"):
        shutil.rmtree(leftover, ignore_errors=True)
    clear_temporary(tmp_dir)
    removed = remove_orphans(out, fmt.relative_path, len(entries))
    if removed:
        log.warning(
            "removed %d file(s) written but never recorded (crash before the manifest line): %s",
            len(removed),
            ", ".join(removed[:5]),
        )
    return Recovered(run_id, entries, header)


def check_captures(dump_dir: Path, fmt_name: str, precision: str = "bf16") -> None:
    """Refuse to start beside a running capture that writes what this format (or a set of this
    precision) cannot use."""
    needed = FORMATS[fmt_name].final_hidden
    for ann in live_announcements(dump_dir):
        if ann.precision == "fp8" and precision != "fp8":
            raise ConfigError(
                f"the capture of the server on port {ann.port} (pid {ann.pid}) stages fp8 rows into {dump_dir} "
                f"(its precision: fp8), and this drain was configured {precision} (--precision {precision}): "
                "every sample would be quarantined. Drain with --precision fp8 (Ansible: hsextract_precision), or "
                "render the capture patch with --precision bf16 and restart the server"
            )
        if ann.final_hidden != needed:
            raise ConfigError(
                f"the capture of the server on port {ann.port} (pid {ann.pid}) writes {ann.final_hidden} final "
                f"hidden states into {dump_dir}, but the format {fmt_name!r} needs {needed}: every sample would "
                f"be quarantined. Render the capture patch with --format {fmt_name} (Ansible: hsextract_format) "
                "and restart the server, or drain in the format that fits"
            )


def check_header_matches_config(out: Path, h: ManifestHeader, c: DrainConfig) -> None:
    """ConfigError naming each field of the output's header that the configuration contradicts,
    and the output as the user gave it (a bucket's prefix, not its work directory)."""
    problems = []
    if h.format != c.format:
        problems.append(f"format {h.format!r} (configured {c.format!r})")
    if h.precision != c.precision:
        problems.append(f"precision {h.precision} (configured {c.precision})")
    if c.expected_dtype and h.dtype != c.expected_dtype:
        problems.append(f"dtype {h.dtype} (configured {c.expected_dtype})")
    if c.expected_hidden_size and h.hidden_size != c.expected_hidden_size:
        problems.append(f"hidden size {h.hidden_size} (configured {c.expected_hidden_size})")
    if c.eagle_layer_ids and tuple(h.eagle_aux_hidden_state_layer_ids) != tuple(c.eagle_layer_ids):
        problems.append(f"eagle layer ids {h.eagle_aux_hidden_state_layer_ids} (configured {list(c.eagle_layer_ids)})")
    problems += model_problems(h, c)
    if problems:
        bucket = c.object_store.url if c.object_store is not None else None
        raise ConfigError(
            (f"{bucket} (work directory {out})" if bucket else f"output directory {out}")
            + " was written with "
            + "; ".join(problems)
            + f". Use the same configuration to resume, or a new {'prefix' if bucket else 'output directory'}."
        )


def model_problems(h: ManifestHeader, c: DrainConfig) -> list[str]:
    """How the model of `c` (``--model``) differs from the one the output's header records: its
    weights, tokenizer or chat template (hsextract.model_fingerprint). Nothing when the header
    records no fingerprint (an older output) or the drain is given no model."""
    if not h.model_fingerprint or not c.model_path:
        return []
    try:
        c.model_fingerprint = model_fingerprint(c.model_path)
    except OSError as exc:
        raise ConfigError(
            f"model {c.model_path}: cannot read it to check it against the output's header ({exc})"
        ) from exc
    parts = differing_parts(h.model_fingerprint, c.model_fingerprint)
    if not parts:
        return []
    names = " and ".join(PART_NAMES.get(p, p) for p in parts)
    return [f"other model {names} than {c.model_path} has (the header's model: {h.model_path or '?'})"]
