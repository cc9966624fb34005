"""Whether a run of the product passed, read from what it left: the drain's manifest and accounts,
the quarantine and its reasons, the clients' summaries and the self-check's numbers. A run passes
only if both processes exited 0, every accepted sample is in the set, none failed or was
quarantined, and the set is not empty."""

from __future__ import annotations

import json
from pathlib import Path


def selfcheck_numbers(out: Path) -> dict:
    """The drain's self-check counts and the logprob check's errors (drain-status.json's ``selfcheck``),
    with ``logprob_done``: every greedy-checked sample's logprobs compared, none left undone."""
    from hsextract.output.run_files import read_drain_status

    status = read_drain_status(out)
    numbers = dict((status.selfcheck if status else None) or {})
    logprob = numbers.get("logprob") or {}
    numbers["logprob_done"] = bool(logprob.get("compared")) and not logprob.get("not_done")
    return numbers


def summarize(
    out: Path, logs: Path, client_rc: int, drain_rc: int, wall: float, client_wall: float, first_request: float | None
) -> dict:
    """One run's outcome: ``ok`` with the processes' exit codes, the set's samples, tokens and bytes,
    the accounts, the quarantine's reasons, the self-check's numbers and the rates; the logs' tails
    where it failed."""
    from hsextract.output.accounts import read_accounts
    from hsextract.output.layout import CLIENT_SUMMARY, client_files
    from hsextract.output.manifest import iter_entries

    summaries = [json.loads(p.read_text()) for p in client_files(out, CLIENT_SUMMARY).values()]
    summary = combine_summaries(summaries)
    accounts = read_accounts(out, out / "quarantine", final=True)
    entries = list(iter_entries(out))
    quarantined = sorted(p.name for p in (out / "quarantine").iterdir()) if (out / "quarantine").is_dir() else []
    reasons: dict[str, int] = {}
    for name in quarantined:
        reason_file = out / "quarantine" / name / "reason.txt"
        reason = reason_file.read_text().splitlines()[0] if reason_file.exists() else "?"
        reasons[reason] = reasons.get(reason, 0) + 1
    tokens = sum(e.tokens for e in entries)
    nbytes = sum(e.bytes for e in entries)
    acc = accounts.as_dict() if accounts else {}
    ok = (
        client_rc == 0
        and drain_rc == 0
        and not quarantined
        and not acc.get("failed")
        and not acc.get("quarantined")
        and not acc.get("unaccounted")
        and acc.get("in_set") == acc.get("accepted")
        and bool(entries)
    )
    return {
        "ok": ok,
        "client_rc": client_rc,
        "drain_rc": drain_rc,
        "samples": len(entries),
        "tokens": tokens,
        "gb": round(nbytes / 1e9, 3),
        "accounts": acc,
        "quarantined_by_reason": reasons,
        "selfchecked": sum(1 for e in entries if e.greedy_check),
        "selfcheck": selfcheck_numbers(out),
        "fingerprinted": sum(1 for e in entries if e.fingerprint),
        "client_summary": {
            k: summary.get(k) for k in ("ok", "failed", "retried", "truncated", "tokens", "wall_s", "startup_s")
        },  # startup_s: the client's own phases
        "client_tokens_per_s": round(summary["tokens"] / summary["wall_s"], 1) if summary.get("wall_s") else None,
        "client_samples_per_s": round(summary["ok"] / summary["wall_s"], 1) if summary.get("wall_s") else None,
        "pipeline_wall_s": round(wall, 2),
        "client_process_wall_s": round(client_wall, 2),
        "pipeline_tokens_per_s": round(tokens / wall, 1) if wall else None,
        "client_startup_s": first_request,
        "drain_gb_per_s": round(nbytes / 1e9 / wall, 3) if wall else None,
        "logs_tail": None if ok else {p.name: tail(p) for p in sorted(logs.glob("*.log"))},
    }


def combine_summaries(summaries: list[dict]) -> dict:
    """The clients' summaries as one: counts and tokens summed, the longest wall time (the processes
    run side by side), ``ok`` the answered samples."""
    if len(summaries) <= 1:
        return summaries[0] if summaries else {}
    out = {k: sum(s.get(k) or 0 for s in summaries) for k in ("ok", "tokens", "truncated")}
    for k in ("failed", "retried"):
        merged: dict = {}
        for s in summaries:
            for reason, n in (s.get(k) or {}).items():
                merged[reason] = merged.get(reason, 0) + n
        out[k] = merged
    out["wall_s"] = max(s.get("wall_s") or 0 for s in summaries)
    out["processes"] = len(summaries)
    return out


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""
