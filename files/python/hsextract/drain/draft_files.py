"""The drain's side of the draft config: written with the other dataset-level files.

The config needs the target's ``config.json`` (and, for SpecForge's run file, its weight index);
the drain reads them from ``--model`` or, without it, from the model path the capture recorded.
A model directory that cannot be read leaves the set without the two files and says so on the
drain's log, with the command that writes them later; it never stops the drain. A full volume is
not that: it is raised, and the drain waits for space as for the other dataset-level files.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from hsextract.draft_config import write_set_draft_files
from hsextract.durable import is_no_space
from hsextract.errors import HsextractError
from hsextract.output.manifest import ManifestEntry, ManifestHeader
from hsextract.vocab.mapping import resolve_sizes

log = logging.getLogger("hsextract.drain")


def write_draft_files_logged(
    out: Path,
    header: ManifestHeader,
    entries: Sequence[ManifestEntry],
    model_path: str | None,
    draft_vocab_sizes: Sequence[int],
) -> list[Path]:
    """`hsextract.draft_config.write_draft_files` for the drain's set; errors logged, never raised."""
    model = model_path or header.model_path
    if not draft_vocab_sizes or not header.vocab_size:
        size = header.vocab_size or 0
    else:
        size = resolve_sizes(draft_vocab_sizes, header.vocab_size)[0].size
    try:
        return write_set_draft_files(out, header, entries, model, size or 32000)
    except (OSError, ValueError, HsextractError) as exc:
        if is_no_space(exc):
            raise  # a full volume: the drain waits for space for every dataset-level file alike
        log.error(
            "draft_config.json not written (%s); write it with `hsextract draft-config --output %s --model "
            "<the model directory>`",
            exc,
            out,
        )
        return []
