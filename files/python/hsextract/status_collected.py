"""``hsextract status`` on a set made by ``hsextract collect``.

A collected set has no drain: collect writes it, once per run of collect, and leaves the files a
drain's output has for the whole fleet (hsextract.collect.bookkeeping: the run id, the dataset
record, the fleet's rejects, failures and quarantine, one client file of the whole dataset) and
its last report (``.hsextract/collect-report.json``, hsextract.collect.report_file). So its status
is read from those: the samples, tokens and bytes of its manifest, its own reconciliation
(hsextract.output.accounts, as for any output), and whether the last collect made it final. Looking
for a drain's status there would report a healthy set as a failed run ("no drain status file", "0 in
the set").

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


def print_collected_status(view: CollectedView, as_json: bool) -> int:
    """Print the collected set's status (text or one JSON object); return the exit status."""
    ok = not view.problems
    if as_json:
        r = view.report
        print(
            json.dumps(
                {
                    "ok": ok,
                    "why": "a collected set (hsextract collect)" + ("" if view.final else ", not final yet"),
                    "problems": view.problems,
                    "drain": None,
                    "client": None,
                    "dataset_lines": view.accounts.lines if view.accounts else None,
                    "accounts": view.accounts.as_dict() if view.accounts else None,
                    "collected": {
                        "final": view.final,
                        "samples": view.samples,
                        "tokens": view.tokens,
                        "bytes": view.bytes,
                        "hosts": {name: h.to_json() for name, h in r.hosts.items()},
                        "refused": r.refused,
                        "missing_shards": r.missing_shards,
                        "doubled_shards": r.doubled_shards,
                        "failed_verification": len(r.failed_verification),
                    },
                },
                indent=2,
            )
        )
    else:
        print("\n".join(collected_status_lines(view)))
    return 0 if ok else 1
