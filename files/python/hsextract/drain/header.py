"""The manifest header of the training set the drain writes: what every sample of it is.

Written once, before the first sample, from the drain's configuration and the first valid dump:
the configuration's facts (from ``--model`` and ``--aux-layers``) where it has them, the dump's
marker (what the capture staged) for the rest. From then on every dump must match it
(`RunHeader.expected`); until then, whatever the configuration says.

The model's fingerprint (hsextract.model_fingerprint) is taken of ``--model``, or without it of the
directory the capture names when that is an absolute path (the server runs on this host): collect
refuses to mix host outputs whose fingerprints differ. A model that cannot be read leaves it out,
with a warning: such an output is collected only with others that have none.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from hsextract import __version__
from hsextract.drain.config import DrainConfig
from hsextract.drain.validate import Expected
from hsextract.formats import FORMATS
from hsextract.model_fingerprint import model_fingerprint
from hsextract.output.manifest import ManifestHeader, default_checksum_algorithm, write_header
from hsextract.staging.dumps import DoneMarker

log = logging.getLogger("hsextract.drain")


def header_fingerprint(cfg: DrainConfig, marker: DoneMarker) -> dict[str, str]:
    """The model's fingerprint for the header (see the module docstring); {} when there is none."""
    if cfg.model_fingerprint is not None:
        return cfg.model_fingerprint
    path = cfg.model_path or (marker.model_path if os.path.isabs(marker.model_path or "") else "")
    try:
        cfg.model_fingerprint = model_fingerprint(path)
    except OSError as exc:
        log.warning(
            "the model's fingerprint is not recorded in the manifest header: %s; collect will take this "
            "output only with others that have none",
            exc,
        )
        cfg.model_fingerprint = {}
    return cfg.model_fingerprint


def header_from_marker(cfg: DrainConfig, marker: DoneMarker, run_id: str) -> ManifestHeader:
    """The header of a training set of `cfg` whose first valid dump is `marker`: the configuration's
    facts where it has them, the marker's for the rest."""
    c, m = cfg, marker
    eagle = list(c.eagle_layer_ids or m.eagle_aux_hidden_state_layer_ids)
    return ManifestHeader(
        format=c.format,
        final_hidden=m.final_hidden,
        dtype=c.expected_dtype or m.dtype,
        precision=c.precision,
        hidden_size=c.expected_hidden_size or m.hidden_size,
        num_aux=len(eagle),
        eagle_aux_hidden_state_layer_ids=eagle,
        sglang_layers_to_capture=list(c.sglang_layer_ids or m.sglang_layers_to_capture),
        num_hidden_layers=c.num_hidden_layers or m.num_hidden_layers,
        model_path=c.model_path or m.model_path,
        model_config_sha256=c.model_config_sha256,
        model_fingerprint=header_fingerprint(c, m),
        architecture=c.architecture or m.architecture,
        vocab_size=c.vocab_size or 0,
        sglang_version=m.sglang_version,
        hsextract_version=__version__,
        run_id=run_id,
        checksum_algorithm=default_checksum_algorithm(),
        created_at=time.time(),
    )


def expected(cfg: DrainConfig, header: ManifestHeader | None) -> Expected:
    """What every dump must look like: the header's facts once it is written, else the configuration's."""
    h = header
    return Expected(
        final_hidden=FORMATS[cfg.format].final_hidden,
        dtype=h.dtype if h else cfg.expected_dtype,
        hidden_size=h.hidden_size if h else cfg.expected_hidden_size,
        eagle_aux_hidden_state_layer_ids=tuple(h.eagle_aux_hidden_state_layer_ids) if h else cfg.eagle_layer_ids,
    )


class RunHeader:
    """The output's header while the drain runs: the one found at start, or the one the first valid
    dump writes (once, whichever worker gets there first). Thread-safe."""

    def __init__(self, cfg: DrainConfig, run_id: str, header: ManifestHeader | None):
        self._cfg = cfg
        self._run_id = run_id
        self._header = header
        self._lock = threading.Lock()

    @property
    def header(self) -> ManifestHeader | None:
        return self._header

    def expected(self) -> Expected:
        return expected(self._cfg, self._header)

    def for_dump(self, marker: DoneMarker) -> ManifestHeader:
        """The header, written from `marker` if there is none yet."""
        with self._lock:
            if self._header is None:
                header = header_from_marker(self._cfg, marker, self._run_id)
                write_header(Path(self._cfg.output), header)
                self._header = header
            return self._header
