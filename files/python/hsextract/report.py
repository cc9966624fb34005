"""What a person reads about a run: `hsextract status`, the play's summary, the client's lines.

Pure functions from the status files' data to lines of text; reading the files is the callers'
job (hsextract.status, hsextract.client; a collected set's screen is hsextract.status_collected's).
Numbers are written in hsextract.units ("6,551", "48.1 MB", "1 min 05 s"), and problems are listed by
reason with the file that holds the details, so an operator never has to decode a dict. Machines read
the JSON (``hsextract status --json``).

To add a section, write a function from :class:`RunView` to lines and call it in
:func:`status_lines`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hsextract.objectstore.retries import describe as describe_retries
from hsextract.output.layout import QUARANTINE_REASON, ProblemFiles
from hsextract.units import count, duration, plural, seconds, size

Snapshot = Mapping[str, Any]


@dataclass(frozen=True)
class RunView:
    """One look at a run: the drain's and the client's status files, and what they mean."""

    output: str
    files: ProblemFiles
    drain: Snapshot | None = None
    client: Snapshot | None = None
    healthy: bool = True
    health: str = ""  # why healthy or not, e.g. "drain running, updated 2 s ago"
    now: float = 0.0
    problems: list[str] = field(default_factory=list)  # what fails a finished run's check (hsextract.output.accounts)
    counts: list[str] = field(default_factory=list)  # the run's reconciliation, one fact a line
    # The reconciliation's figures (`Accounts.as_dict`): the table's rejected, failed and quarantined
    # rows take them, so they agree with `counts` (the status files hold the last process's counts).
    accounts: Snapshot | None = None
    # (samples the dataset-level files cover, samples in the set), where known (hsextract.output.finalized).
    dataset_files: tuple[int, int] | None = None
    commits: Snapshot | None = None  # the commit timeline (hsextract.output.commit_timeline.CommitTimeline.to_json)

    @property
    def dataset_files_behind(self) -> bool:
        return self.dataset_files is not None and self.dataset_files[0] != self.dataset_files[1]


# ---- the screens' parts --------------------------------------------------------------------------


def table(rows: list[tuple[str, str]], indent: str = "  ") -> list[str]:
    """Rows of (label, text) with the texts aligned in one column."""
    width = max((len(label) for label, _ in rows), default=0)
    return [f"{indent}{label:<{width}}   {text}".rstrip() for label, text in rows]


def sentence(text: str) -> str:
    """`text` ended by one full stop: a message that ends with its own is not given a second."""
    text = text.rstrip()
    return text if text.endswith((".", "!", "?")) else f"{text}."


# ---- the client ------------------------------------------------------------------------------------


def _client_done(snap: Snapshot) -> int:
    return (
        int(snap.get("ok", 0)) + int(snap.get("skipped", 0)) + int(snap.get("failed", 0)) + int(snap.get("rejected", 0))
    )


def progress_line(snap: Snapshot) -> str:
    """The client's progress in one line (its log every few seconds, or its bar on a terminal)."""
    line = (
        f"{count(_client_done(snap))} of {count(snap.get('samples_total', 0))} samples done "
        f"({count(snap.get('ok', 0))} answered, {count(snap.get('skipped', 0))} skipped, "
        f"{count(snap.get('failed', 0))} failed, {count(snap.get('rejected', 0))} rejected), "
        f"{count(snap.get('tokens_per_s', 0))} tokens/s, ETA {duration(snap.get('eta_s'))}"
    )
    if snap.get("paused_reason"):
        line += f"; paused: {snap['paused_reason']}"
    return line


def _by_reason(
    rows: list[tuple[str, str]], label: str, total: int, reasons: Mapping[str, int] | None, where: str
) -> None:
    """A total with the file that lists it, then one indented row per reason, most frequent first."""
    rows.append((label, f"{count(total)}" + (f", listed in {where}" if total else "")))
    ordered = sorted((reasons or {}).items(), key=lambda kv: (-kv[1], kv[0]))
    width = max((len(reason) for reason, _ in ordered), default=0)
    digits = max((len(count(n)) for _, n in ordered), default=0)
    rows += [("", f"  {reason:<{width}}  {count(n):>{digits}}") for reason, n in ordered]


def client_lines(snap: Snapshot, files: ProblemFiles) -> list[str]:
    """The client's closing report: what it sent, how fast, and what it could not."""
    elapsed = float(snap.get("updated_at", 0)) - float(snap.get("started_at", 0))
    tokens = int(snap.get("tokens", 0))
    state = snap.get("state", "?")
    head = {"done": "The client is done", "stopped": "The client was stopped", "failed": "The client failed"}.get(
        state, f"The client is {state}"
    )
    lines = [
        f"{head}: {count(_client_done(snap))} of {plural(int(snap.get('samples_total', 0)), 'sample')} "
        f"have an outcome, {count(snap.get('ok', 0))} answered in {duration(elapsed)} "
        f"({plural(tokens, 'token')}, {count(tokens / elapsed if elapsed > 0 else 0)} tokens/s)."
    ]
    if snap.get("error"):
        lines.append(f"Error: {snap['error']}")
    rows = [
        ("skipped", f"{count(snap.get('skipped', 0))} already written or staged by an earlier run"),
        ("truncated", count(snap.get("truncated", 0))),
    ]
    _by_reason(rows, "rejected", int(snap.get("rejected", 0)), snap.get("rejected_by_reason"), files.rejected)
    _by_reason(rows, "failed", int(snap.get("failed", 0)), snap.get("failed_by_reason"), files.failed)
    return lines + table(rows)


# ---- the whole run (hsextract status, the play's summary) -----------------------------------------


def _lag(drain: Snapshot) -> int:
    """Complete dumps waiting for the drain (none once it is done: it stops only when staging is empty,
    while its count is the last full scan's)."""
    return 0 if drain.get("state") == "done" else int(drain.get("lag", 0))


def headline(view: RunView) -> str:
    """One sentence: where the run stands."""
    client, drain = view.client, view.drain or {}
    in_set = count(drain.get("samples_total", 0))
    if not view.healthy:
        return sentence(f"FAIL: {view.health}")
    if client is None:
        return f"The client has not started yet; {in_set} samples are in the training set."
    state = client.get("state")
    done, total = count(_client_done(client)), count(client.get("samples_total", 0))
    if state == "done":
        return _client_done_headline(view, in_set)
    if state == "failed":
        return sentence(f"The client failed: {client.get('error') or 'see its journal'}")
    if state == "stopped":
        return f"The client was stopped after {done} of {total} samples; run it again to resume."
    if state == "paused":
        since = client.get("paused_for_s")
        for_how_long = f" for {duration(since)}" if since is not None else ""
        return f"The run is paused{for_how_long} ({client.get('paused_reason')}): {done} of {total} samples done."
    return f"The run is going: {done} of {total} samples done, ETA {duration(client.get('eta_s'))}."


def _client_done_headline(view: RunView, in_set: str) -> str:
    """The client is done; the run is done only once the drain has written every sample and the
    dataset-level files (the Arrow dataset, the draft vocabulary) cover them."""
    drain = view.drain or {}
    lag = _lag(drain)
    waiting = f", {plural(lag, 'sample')} still wait{'s' if lag == 1 else ''} for the drain" if lag else ""
    if drain.get("paused_reason"):
        return (
            f"The client is done, but the drain is paused ({drain['paused_reason']}): {in_set} samples are in "
            f"the training set{waiting}."
        )
    if lag:
        return f"The client is done: {in_set} samples are in the training set{waiting}."
    if view.dataset_files is not None and view.dataset_files_behind:
        return (
            f"The client is done and {in_set} samples are in the training set, but the dataset-level files "
            f"cover {count(view.dataset_files[0])} of them."
        )
    return f"The run is done: {in_set} samples are in the training set."


def set_kind(fmt: str | None, precision: str | None) -> str:
    """ " (speculators)", or " (speculators, fp8 rows)" for a set that does not store the rows as captured."""
    if not fmt:
        return ""
    return f" ({fmt}, {precision} rows)" if precision and precision != "bf16" else f" ({fmt})"


def _progress_rows(view: RunView) -> list[tuple[str, str]]:
    client, drain = view.client or {}, view.drain or {}
    rows = [("training set", f"{view.output}" + set_kind(drain.get("format"), drain.get("precision")))]
    rows.append(("drain", view.health.removeprefix("drain ")))
    samples = f"{count(drain.get('samples_total', 0))} in the set"
    if client:
        samples += (
            f"; the client answered {count(client.get('ok', 0))} and skipped "
            f"{count(client.get('skipped', 0))} of {count(client.get('samples_total', 0))}"
        )
    rows.append(("samples", samples))
    tokens = drain.get("tokens_total", drain.get("tokens"))
    rows.append(("tokens", f"{count(tokens)} in the set" if tokens is not None else "-"))
    written = drain.get("bytes_total", drain.get("bytes"))
    rows.append(("written", size(written)))
    finished = client.get("state") in ("done", "stopped", "failed")
    elapsed = None
    if client.get("started_at"):
        end = float(client.get("updated_at", 0)) if finished else view.now
        elapsed = max(0.0, end - float(client["started_at"]))
    if finished and elapsed:
        rate = f"{count(int(client.get('tokens', 0)) / elapsed)} tokens/s on average"
    elif client:
        rate = f"{count(client.get('tokens_per_s', 0))} tokens/s"
    else:
        rate = "-"
    if drain and not finished:
        rate += f"; the drain writes {drain.get('mb_per_s', 0):,.1f} MB/s"
    rows.append(("rate", rate))
    rows.append(("elapsed", duration(elapsed)))
    rows.append(("ETA", "done" if client.get("state") == "done" else duration(client.get("eta_s"))))
    rows.append(
        (
            "staged",
            f"{count(_lag(drain))} waiting for the drain, {count(client.get('in_flight', 0))} requests in flight",
        )
    )
    if drain.get("paused_reason"):
        rows.append(("drain paused", str(drain["paused_reason"])))
    store = drain.get("objectstore") or {}
    if store:
        retries = store.get("retries")
        said = describe_retries(retries) if isinstance(retries, dict) else "retries not counted by this drain"
        rows.append(("object store", f"{store.get('url', '?')}: {said}"))
    return rows + _commit_rows(view)


def _commit_rows(view: RunView) -> list[tuple[str, str]]:
    """When the samples were committed, a tail after the client's end, and the self-check's queue."""
    timeline, rows = view.commits or {}, []
    if timeline.get("commits"):
        rows.append(
            (
                "commits",
                f"{count(timeline['samples'])} samples in {plural(timeline['commits'], 'commit')}, the first at "
                f"{_clock(timeline['first_at'])}, the last at {_clock(timeline['last_at'])}",
            )
        )
    after = timeline.get("after_client_end") or {}
    if timeline.get("client_end_at") is not None and after.get("samples"):
        tail = (
            f"{plural(after['samples'], 'sample')} in {plural(after['commits'], 'commit')} after the client's end, "
            f"the last {seconds(after['last_s'])} after it"
        )
        rows.append(("tail" if timeline.get("tail") else "after end", tail))
    check = (view.drain or {}).get("selfcheck") or {}
    queue = check.get("queue") or {}
    if queue:
        rows.append(
            (
                "self-check",
                f"{count(check.get('checked', 0))} of {count(check.get('seen', 0))} samples checked; "
                f"{count(queue.get('waiting', 0))} waiting, {count(queue.get('running', 0))} in the pass under way, "
                f"{count(queue.get('skipped_for_load', 0))} skipped for load",
            )
        )
    return rows


def _clock(at: float | None) -> str:
    return "-" if at is None else time.strftime("%H:%M:%S", time.localtime(float(at)))


def problem_rows(view: RunView) -> list[tuple[str, str]]:
    client, drain = view.client or {}, view.drain or {}
    rows: list[tuple[str, str]] = []
    accounts = view.accounts
    if accounts is not None:  # the run's files, as `counts` reads them
        rejected, failed, quarantined = accounts["rejected"], accounts["failed"], accounts["quarantined"]
    else:  # the last client's and the last drain's own counts
        rejected, failed = client.get("rejected_by_reason") or {}, client.get("failed_by_reason") or {}
        quarantined = drain.get("quarantined_by_reason") or {}
    _by_reason(
        rows,
        "rejected",
        int(client.get("rejected", 0)) if accounts is None else sum(rejected.values()),
        rejected,
        view.files.rejected,
    )
    _by_reason(
        rows,
        "failed",
        int(client.get("failed", 0)) if accounts is None else sum(failed.values()),
        failed,
        view.files.failed,
    )
    _by_reason(
        rows,
        "quarantined",
        int(drain.get("quarantined", 0)) if accounts is None else sum(quarantined.values()),
        quarantined,
        f"{view.files.quarantined}/<rid>/{QUARANTINE_REASON}",
    )
    stale = int(drain.get("stale_removed", 0))
    if stale:  # staged dumps that were never samples of this run, or were written already: nothing lost
        _by_reason(rows, "stale removed", stale, drain.get("stale_removed_by_reason"), "the drain's journal")
    return rows


def count_rows(view: RunView) -> list[tuple[str, str]]:
    return [("counts" if i == 0 else "", line) for i, line in enumerate(view.counts)]


def status_lines(view: RunView) -> list[str]:
    """`hsextract status` and the play's closing summary."""
    problems = [sentence(f"FAIL: {problem}") for problem in view.problems]
    return [headline(view), *problems, *table(_progress_rows(view) + problem_rows(view) + count_rows(view))]
