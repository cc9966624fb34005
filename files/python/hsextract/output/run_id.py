"""The run id of an output directory: what ties its staged dumps, records and manifest to one run.

Every request id carries it (hsextract.staging.records.make_rid), so the drain takes only the dumps
of its own output directory from a staging directory that several runs may share. It is created
once, in ``<output>/run.json`` (hsextract.output.layout.run_file_path), by whichever of the client
and the drain starts first; the other reads it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path

from hsextract.errors import ConfigError
from hsextract.output.layout import run_file_path


def load_or_create_run_id(output_dir: str | Path) -> str:
    """The run id of an output directory, created once (O_EXCL) by whichever of client or drain starts first."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = run_file_path(out)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"run_id": secrets.token_hex(4)}))
            f.flush()
            os.fsync(f.fileno())
    for _ in range(50):
        try:
            run_id = json.loads(path.read_text())["run_id"]
            if re.fullmatch(r"[0-9a-f]{8,32}", run_id):
                return run_id
        except (ValueError, KeyError):
            pass  # being written by the other process right now
        time.sleep(0.05)
    raise ConfigError(f"{path}: no valid run id in it; remove the file to start a new run")
