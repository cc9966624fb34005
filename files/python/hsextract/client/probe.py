"""The client's start-up check that the server's capture stages into the client's staging directory,
in the placement the format needs.

Client, capture and drain must agree on the staging directory, the run and the final-norm
placement. A client pointed at another directory than its server's capture writes to would see
every request answered while no dump ever reaches its drain; a capture rendered for post-norm
states would have every sample of a speculators run quarantined. So before the first sample, the
client sends one probe request (``<prefix>-<run id>-p<hex>``, which the drain never takes for a
sample), waits for its dump in its own staging directory and checks what the capture wrote. Any
disagreement stops the run before anything is sent, naming both sides.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from hsextract.client.sender import Sender
from hsextract.errors import ConfigError
from hsextract.formats import final_hidden_for
from hsextract.records import make_probe_rid
from hsextract.staging import (
    DONE_FILE,
    FAILED_FILE,
    discard_dump,
    live_announcements,
    read_done_marker,
    read_failed_marker,
    rid_dir,
)


@dataclass(frozen=True)
class ProbeResult:
    rid: str
    final_hidden: str
    hidden_size: int
    seconds: float


def _announced(dump_dir: Path) -> str:
    anns = live_announcements(dump_dir)
    if not anns:
        return f"no running capture has announced itself in {dump_dir}"
    return "captures announced there: " + "; ".join(
        f"pid {a.pid} on {a.host} (server port {a.port}, dump dir {a.dump_dir}, final hidden {a.final_hidden})"
        for a in anns)


def probe_capture(sender: Sender, dump_dir: Path, prefix: str, run_id: str, fmt: str, hidden_size: int,
                  input_ids: list[int], timeout_s: float = 60.0) -> ProbeResult:
    """Send one probe and check its dump; raise ConfigError saying what disagrees and how to fix it."""
    rid = make_probe_rid(prefix, run_id)
    t0 = time.monotonic()
    res = sender.send(rid, input_ids)
    if not res.ok:
        raise ConfigError(f"the start-up probe to {sender.base_url} failed ({res.reason}: {res.detail}); "
                          "check the server before sending the dataset")
    d = rid_dir(dump_dir, rid)
    try:
        deadline = time.monotonic() + timeout_s
        while not (d / DONE_FILE).exists() and not (d / FAILED_FILE).exists():
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"the server {sender.base_url} answered the start-up probe {rid}, but no dump of it appeared in "
                    f"the staging directory {dump_dir} within {timeout_s:.0f} s: {_announced(dump_dir)}. The "
                    "server must run with the capture package, and the capture's dump_dir must be this client's "
                    "--dump-dir (and the drain's)")
            time.sleep(0.05)
        if (d / FAILED_FILE).exists():
            marker = read_failed_marker(d)
            raise ConfigError(f"the capture could not stage the start-up probe {rid} in {dump_dir}: "
                              f"{marker.reason if marker else '?'}: {marker.detail if marker else ''}")
        done = read_done_marker(d)
        needed = final_hidden_for(fmt)
        if done.final_hidden != needed:
            raise ConfigError(
                f"the capture writes {done.final_hidden} final hidden states into {dump_dir}, but the format "
                f"{fmt!r} needs {needed}: every sample would be quarantined. Render the capture patch with "
                f"--format {fmt} (Ansible: hsextract_format) and restart the server, or run with the format "
                "that fits the capture")
        if hidden_size and done.hidden_size != hidden_size:
            raise ConfigError(f"the capture writes hidden size {done.hidden_size} into {dump_dir}, but the model "
                              f"given to the client has {hidden_size}: is the server serving another model?")
        return ProbeResult(rid, done.final_hidden, done.hidden_size, time.monotonic() - t0)
    finally:
        discard_dump(d)
