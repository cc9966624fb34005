"""The end of a collect: the fleet's bookkeeping, the dataset-level files, the reconciliation, the
card, the report, and the exit status.

The exit status is 0 when everything given was collected and nothing needs a person; 3
(RUN_CHECK_FAILED, as the drain's) when a host output was refused, a sample failed
verification or was left out as a duplicate, a host's quarantine entry was not copied (not a
regular file inside it), or, for ``--final``, when the shards do not cover
the dataset exactly once or the fleet's counts do not add up. A collect that is not final only
warns about shards it has not seen yet: hosts may still be on their way.
"""

from __future__ import annotations

from collections import Counter

from hsextract.collect.accounts import fleet_accounts
from hsextract.collect.bookkeeping import (
    copy_quarantine,
    write_fleet_client_files,
    write_if_changed,
    write_merged_lists,
)
from hsextract.collect.card import HostLine, card_text
from hsextract.collect.config import Collected, CollectResult
from hsextract.collect.finalize import finalize_collected
from hsextract.collect.report_file import CollectedHost, CollectReport, write_collect_report
from hsextract.collect.shards import Coverage, check_coverage
from hsextract.output.layout import DATASET_CARD
from hsextract.vocab.files import read_summary

RUN_CHECK_FAILED = 3


def finish(c: Collected) -> CollectResult:
    """Everything after the samples: every write replaces a file only when its bytes change, so
    it is repeated safely (after a kill, or a full volume waited out)."""
    out, cfg, header = c.cfg.into, c.cfg, c.ref.header
    lines = [*c.notes, *c.admission.refused]
    if header is None:
        lines.append("nothing to collect: no host output given has a sample yet")
        return CollectResult(RUN_CHECK_FAILED if c.admission.refused else 0, 0, len(c.entries), lines)
    in_set = {e.dataset_index for e in c.entries}
    failures = [d for d in (c.journal.lines if c.journal else []) if d.get("index") not in in_set]
    write_merged_lists(out, c.admission.admitted, failures)
    left_out = copy_quarantine(out, c.admission.admitted)
    shards = {h.name: [c_.shard for c_ in h.clients] for h in c.admission.admitted}
    dataset_lines = c.ref.lines or 0
    coverage = check_coverage(shards, dataset_lines)
    final = bool(shards) and coverage.complete and all(h.finished for h in c.admission.admitted)
    write_fleet_client_files(out, dataset_lines, final, {h: [s.to_json() for s in ss] for h, ss in shards.items()})
    finalize_collected(
        out, c.fmt, header, c.entries, c.admission.admitted, cfg.draft_vocab_sizes, cfg.vocab_size or header.vocab_size
    )
    accounts = fleet_accounts(
        c.admission.admitted, dataset_lines, in_set, {int(d["index"]): str(d.get("reason")) for d in failures}, final
    )
    by_host = Counter(e.host for e in c.entries)
    failed_by_host = Counter(str(d.get("host")) for d in failures)
    account_lines = accounts.lines_of_text(dict(by_host), dict(failed_by_host))
    _write_card(c, dataset_lines, account_lines)
    lines += c.plan.duplicates + left_out
    lines += [
        f"FAILED {d['host']} sample {d['host_index']} (dataset index {d['index']}): {d['reason']}: {d['detail']}"
        for d in failures
    ]
    lines += [
        f"collected {c.new} new sample(s) into {out}: {len(c.entries)} in all"
        f" ({len(c.plan.already)} were there already)",
        *account_lines,
    ]
    lines += _coverage_lines(coverage, c.cfg.final) + [f"PROBLEM {p}" for p in accounts.problems]
    bad = bool(
        c.admission.refused
        or failures
        or c.plan.duplicates
        or left_out
        or accounts.problems
        or (cfg.final and not coverage.complete)
    )
    report = _report(c, failures, coverage, accounts.fleet.as_dict(), final)
    write_collect_report(out, report)
    return CollectResult(RUN_CHECK_FAILED if bad else 0, c.new, len(c.entries), lines, report)


def nothing_admitted(c: Collected) -> CollectResult:
    """The answer of a collect that admitted no host output: it wrote nothing into the set (not even
    its report), so an existing set's bookkeeping stays as the last collect left it."""
    lines = [
        *c.admission.refused,
        f"no host output was admitted: nothing in the collected set was changed ({c.cfg.into})",
    ]
    return CollectResult(RUN_CHECK_FAILED if c.admission.refused else 0, 0, len(c.entries), lines)


def _coverage_lines(coverage: Coverage, final: bool) -> list[str]:
    word = "FAIL" if final else "WARN"
    return [f"{word} {m}" for m in coverage.missing] + [f"{word} {m}" for m in coverage.doubled]


def _write_card(c: Collected, dataset_lines: int, account_lines: list[str]) -> None:
    out = c.cfg.into
    counts = Counter(e.host for e in c.entries)
    hosts = [
        HostLine(
            h.name,
            ", ".join(str(x.shard) for x in h.clients) or "?",
            counts.get(h.name, 0),
            "finished" if h.finished else "draining" if h.clients_finished else "extracting",
        )
        for h in c.admission.admitted
    ]
    assert c.ref.header is not None
    text = card_text(
        str(out),
        c.ref.header,
        len(c.entries),
        sum(e.tokens for e in c.entries),
        sum(e.bytes for e in c.entries),
        hosts,
        c.ref.dataset,
        dataset_lines or None,
        account_lines,
        read_summary(out) if c.cfg.draft_vocab_sizes is not None else None,
    )
    write_if_changed(out / DATASET_CARD, text.encode())


def _report(
    c: Collected, failures: list[dict], coverage: Coverage, fleet: dict[str, object], final: bool
) -> CollectReport:
    """What ``.hsextract/collect-report.json`` holds (hsextract.collect.report_file)."""
    counts = Counter(e.host for e in c.entries)
    return CollectReport(
        into=str(c.cfg.into),
        final=final,
        samples=len(c.entries),
        hosts={
            h.name: CollectedHost(
                collected=counts.get(h.name, 0),
                finished=h.finished,
                path=str(h.path),
                samples_in_host=len(h.entries),
                shards=[x.shard for x in h.clients],
            )
            for h in c.admission.admitted
        },
        refused=c.admission.refused,
        duplicates=c.plan.duplicates,
        failed_verification=failures,
        missing_shards=coverage.missing,
        doubled_shards=coverage.doubled,
        accounts=fleet,
    )
