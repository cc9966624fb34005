"""``hsextract status`` on a set made by ``hsextract collect``.

A collected set has no drain: collect writes it, once per run of collect, and leaves the files a
drain's output has for the whole fleet (hsextract.collect.bookkeeping: the run id, the dataset
record, the fleet's rejects, failures and quarantine, one client file of the whole dataset) and
its last report (``.hsextract/collect-report.json``). So its status is read from those: the
samples, tokens and bytes of its manifest, its own reconciliation (hsextract.output.accounts, as for
any output), and whether the last collect made it final. Looking for a drain's status there would
report a healthy set as a failed run ("no drain status file", "0 in the set").

It exits non-zero only when a final set fails its check (its counts do not add up, or too many
samples failed or were quarantined), as a finished run does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hsextract.output.accounts import read_accounts
from hsextract.output.layout import collect_report_path
from hsextract.output.manifest import iter_entries, read_header
from hsextract.output.run_files import read_json_object
from hsextract.report import CollectedView, collected_status_lines


def read_collect_report(output: str | Path) -> dict[str, Any] | None:
    """The last collect's report of `output`, or None when `output` is not a collected set."""
    return read_json_object(collect_report_path(output))


def collected_view(output: Path, report: dict[str, Any], files, max_failure_share: float) -> CollectedView:
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
        accounts=accounts.as_dict() if accounts else None,
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
                    "dataset_lines": view.accounts.get("lines") if view.accounts else None,
                    "accounts": view.accounts,
                    "collected": {
                        "final": view.final,
                        "samples": view.samples,
                        "tokens": view.tokens,
                        "bytes": view.bytes,
                        "hosts": r.get("hosts") or {},
                        "refused": r.get("refused") or [],
                        "missing_shards": r.get("missing_shards") or [],
                        "doubled_shards": r.get("doubled_shards") or [],
                        "failed_verification": len(r.get("failed_verification") or []),
                    },
                },
                indent=2,
            )
        )
    else:
        print("\n".join(collected_status_lines(view)))
    return 0 if ok else 1
