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
from urllib.parse import urlsplit

from hsextract.client.sender import STOPPED, Sender, StopRequested
from hsextract.errors import ConfigError
from hsextract.formats import final_hidden_for
from hsextract.staging.announcements import CaptureAnnouncement, live_announcements
from hsextract.staging.dumps import (
    DONE_FILE,
    FAILED_FILE,
    discard_dump,
    read_done_marker,
    read_failed_marker,
    rid_dir,
)
from hsextract.staging.names import CAPTURES_DIR
from hsextract.staging.records import make_probe_rid
from hsextract.units import duration


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
        for a in anns
    )


def _captures_beside(dump_dir: Path, server_url: str) -> list[CaptureAnnouncement]:
    """The running captures of the server at `server_url` announced in a directory beside `dump_dir`.

    A mistyped --dump-dir is most often a sibling of the right one (both under /dev/shm); the
    server stages the probe there, and its sender is who removes it (no drain of that directory
    takes another run's probe for a sample, and until it is removed it stands among that run's
    dumps)."""
    port = urlsplit(server_url).port
    try:
        parent = dump_dir.resolve().parent
        siblings = sorted(p for p in parent.iterdir() if p.is_dir() and p != dump_dir.resolve())
    except OSError:
        return []
    found = []
    for d in siblings:
        if (d / CAPTURES_DIR).is_dir():
            found += [a for a in live_announcements(d) if port is None or a.port == port]
    return found


def _remove_probe_elsewhere(rid: str, captures: list[CaptureAnnouncement], wait_s: float = 5.0) -> None:
    """Remove the probe's dump from the staging directories the server's captures write (once it is
    complete or failed there, so that the capture does not write it again after the removal)."""
    for d in {rid_dir(a.dump_dir, rid) for a in captures}:
        deadline = time.monotonic() + wait_s
        while (
            d.exists()
            and not (d / DONE_FILE).exists()
            and not (d / FAILED_FILE).exists()
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        discard_dump(d)


def _not_here(sender: Sender, rid: str, dump_dir: Path, timeout_s: float) -> ConfigError:
    """The refusal of a probe whose dump never appeared in `dump_dir`, naming where it went if known."""
    elsewhere = _captures_beside(dump_dir, sender.base_url)
    _remove_probe_elsewhere(rid, elsewhere)
    hint = ""
    if elsewhere:
        dirs = sorted({a.dump_dir for a in elsewhere})
        hint = (
            f" The server's capture stages into {' and '.join(dirs)} (its probe dump was removed from there): "
            f"run with --dump-dir {dirs[0]}."
        )
    return ConfigError(
        f"the server {sender.base_url} answered the start-up probe {rid}, but no dump of it appeared in "
        f"the staging directory {dump_dir} within {duration(timeout_s)}: {_announced(dump_dir)}. The "
        "server must run with the capture package, and the capture's dump_dir must be this client's "
        f"--dump-dir (and the drain's).{hint}"
    )


def probe_capture(
    sender: Sender,
    dump_dir: Path,
    prefix: str,
    run_id: str,
    fmt: str,
    hidden_size: int,
    input_ids: list[int],
    timeout_s: float = 60.0,
) -> ProbeResult:
    """Send one probe and check its dump; raise ConfigError saying what disagrees and how to fix it,
    StopRequested if the client is asked to stop meanwhile (``sender.stop``)."""
    rid = make_probe_rid(prefix, run_id)
    t0 = time.monotonic()
    if sender.stop.is_set():
        raise StopRequested("asked to stop before the start-up probe")
    res = sender.send(rid, input_ids)
    if res.reason == STOPPED:
        raise StopRequested("asked to stop while sending the start-up probe")
    if not res.ok:
        raise ConfigError(
            f"the start-up probe to {sender.base_url} failed ({res.reason}: {res.detail}); "
            "check the server before sending the dataset"
        )
    d = rid_dir(dump_dir, rid)
    try:
        deadline = time.monotonic() + timeout_s
        while not (d / DONE_FILE).exists() and not (d / FAILED_FILE).exists():
            if time.monotonic() > deadline:
                raise _not_here(sender, rid, dump_dir, timeout_s)
            if sender.stop.wait(0.05):
                raise StopRequested("asked to stop while waiting for the start-up probe's dump")
        if (d / FAILED_FILE).exists():
            marker = read_failed_marker(d)
            raise ConfigError(
                f"the capture could not stage the start-up probe {rid} in {dump_dir}: "
                f"{marker.reason if marker else '?'}: {marker.detail if marker else ''}"
            )
        done = read_done_marker(d)
        needed = final_hidden_for(fmt)
        if done.final_hidden != needed:
            raise ConfigError(
                f"the capture writes {done.final_hidden} final hidden states into {dump_dir}, but the format "
                f"{fmt!r} needs {needed}: every sample would be quarantined. Render the capture patch with "
                f"--format {fmt} (Ansible: hsextract_format) and restart the server, or run with the format "
                "that fits the capture"
            )
        if hidden_size and done.hidden_size != hidden_size:
            raise ConfigError(
                f"the capture writes hidden size {done.hidden_size} into {dump_dir}, but the model "
                f"given to the client has {hidden_size}: is the server serving another model?"
            )
        return ProbeResult(rid, done.final_hidden, done.hidden_size, time.monotonic() - t0)
    finally:
        discard_dump(d)
