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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hsextract.collect.report_file import CollectedHost, CollectReport
from hsextract.output.accounts import Accounts, read_accounts
from hsextract.output.layout import ProblemFiles
from hsextract.output.manifest import iter_entries, read_header
from hsextract.report import RunView, count_rows, problem_rows, sentence, set_kind, table
from hsextract.status_report import CollectedStatus, StatusReport
from hsextract.units import count, plural, size


@dataclass(frozen=True)
class CollectedView:
    """One look at a set made by ``hsextract collect``: its manifest's totals, its last collect's
    report (``.hsextract/collect-report.json``) and its own reconciliation. No drain writes it, so
    there is no drain status to look for."""

    output: str
    files: ProblemFiles
    format: str
    samples: int  # in the set (its manifest)
    tokens: int
    bytes: int
    report: CollectReport  # the last collect's
    problems: list[str] = field(default_factory=list)  # what fails a final set's check
    counts: list[str] = field(default_factory=list)
    accounts: Accounts | None = None  # the set's own reconciliation
    precision: str = "bf16"  # how the set stores its rows (its manifest header's)

    @property
    def final(self) -> bool:
        return self.report.final


def _host_list(hosts: Mapping[str, CollectedHost]) -> str:
    """ "a (0/3): 9, b (1/3): 9": each host with its shards and the samples collected from it."""
    parts = []
    for name, h in hosts.items():
        shards = ", ".join(str(s) for s in h.shards)
        parts.append(f"{name} ({shards or '?'}): {count(h.collected)}" + ("" if h.finished else ", not finished"))
    return ", ".join(parts)


def collected_headline(view: CollectedView) -> str:
    hosts = len(view.report.hosts)
    held = f"{plural(view.samples, 'sample')} from {plural(hosts, 'host')} are in the training set"
    if view.final:
        return f"The collected set is final: {held}."
    return f"The collected set is not final yet: {held}; collect again with every host once each has finished."


def _last_collect_rows(report: CollectReport) -> list[tuple[str, str]]:
    """What the last collect found that a person should know: hosts refused, shards not seen,
    samples left out or failed at verification."""
    found = [*report.refused, *report.missing_shards, *report.doubled_shards, *report.duplicates]
    failed = len(report.failed_verification)
    if failed:
        found.append(f"{plural(failed, 'sample')} failed verification (listed with the failures)")
    return [("last collect" if i == 0 else "", str(line)) for i, line in enumerate(found)]


def collected_status_lines(view: CollectedView) -> list[str]:
    """`hsextract status` on a collected set: where it stands, its totals, its hosts, its counts."""
    rows = [
        ("training set", f"{view.output}" + set_kind(view.format, view.precision)),
        (
            "samples",
            f"{count(view.samples)} in the set, collected from {_host_list(view.report.hosts) or 'no host'}",
        ),
        ("tokens", f"{count(view.tokens)} in the set"),
        ("written", size(view.bytes)),
    ]
    rows += _last_collect_rows(view.report)
    accounts = view.accounts.as_dict() if view.accounts else None
    run = RunView(output=view.output, files=view.files, accounts=accounts, counts=view.counts)
    problems = [sentence(f"FAIL: {problem}") for problem in view.problems]
    return [collected_headline(view), *problems, *table(rows + problem_rows(run) + count_rows(run))]


def collected_view(output: Path, report: CollectReport, files: ProblemFiles, max_failure_share: float) -> CollectedView:
    entries = list(iter_entries(output))
    header = read_header(output)
    accounts = read_accounts(output)
    return CollectedView(
        output=str(output),
        files=files,
        format=header.format if header else "",
        precision=header.precision if header else "bf16",
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
        collected=CollectedStatus(view.samples, view.tokens, view.bytes, view.report, view.precision),
    )


def print_collected_status(view: CollectedView, as_json: bool) -> int:
    """Print the collected set's status (text or one JSON object); return the exit status."""
    if as_json:
        print(json.dumps(collected_status_report(view).to_json(), indent=2))
    else:
        print("\n".join(collected_status_lines(view)))
    return 1 if view.problems else 0
