"""``hsextract status`` on a set made by ``hsextract collect``.

A collected set has no drain: collect writes it, once per run of collect, and leaves the files a
drain's output has for the whole fleet (hsextract.collect.bookkeeping: the run id, the dataset
record, the fleet's rejects, failures and quarantine, one client file of the whole dataset) and
its last report (``.hsextract/collect-report.json``, hsextract.collect.report_file). So its status
is read from those: the samples, tokens and bytes of its manifest, its own reconciliation
(hsextract.output.accounts, as for any output), and whether the last collect made it final. Looking
for a drain's status there would report a healthy set as a failed run ("no drain status file", "0 in
the set"). Its ``--json`` object is the run's record (hsextract.status_report.StatusReport) with
the collected set's part in place of the dataset-level files'.

It exits non-zero only when a final set fails its check (its counts do not add up, or too many
samples failed or were quarantined), as a finished run does.
"""

from __future__ import annotations

import json
from pathlib import Path

from hsextract.collect.report_file import CollectReport
from hsextract.output.accounts import read_accounts
from hsextract.output.manifest import iter_entries, read_header
from hsextract.report import CollectedView, ProblemFiles, collected_status_lines
from hsextract.status_report import CollectedStatus, StatusReport


def collected_view(output: Path, report: CollectReport, files: ProblemFiles, max_failure_share: float) -> CollectedView:
    entries = list(iter_entries(output))
    header = read_header(output)
    accounts = read_accounts(output)
    return CollectedView(
        output=str(output),
        files=files,
        format=header.format if header else "",
        samples=len(entries),
        tokens=sum(e.tokens for e in entries),
        bytes=sum(e.bytes for e in entries),
        report=report,
        problems=accounts.problems(max_failure_share) if accounts else [],
        counts=accounts.lines_of_text() if accounts else [],
        accounts=accounts,
    )


def collected_status_report(view: CollectedView) -> StatusReport:
    """The ``--json`` object of a collected set: no drain, no client, its own accounts."""
    return StatusReport(
        ok=not view.problems,
        why="a collected set (hsextract collect)" + ("" if view.final else ", not final yet"),
        problems=view.problems,
        drain=None,
        client=None,
        dataset_lines=view.accounts.lines if view.accounts else None,
        accounts=view.accounts,
        dataset_files=None,
        collected=CollectedStatus(view.samples, view.tokens, view.bytes, view.report),
    )


def print_collected_status(view: CollectedView, as_json: bool) -> int:
    """Print the collected set's status (text or one JSON object); return the exit status."""
    if as_json:
        print(json.dumps(collected_status_report(view).to_json(), indent=2))
    else:
        print("\n".join(collected_status_lines(view)))
    return 1 if view.problems else 0
