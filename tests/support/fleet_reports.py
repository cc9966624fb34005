"""What the hosts of a fleet report, as `hsextract fleet` reads it: a host's `hsextract plan --json`
report and its `hsextract status --json`, with the fields the fleet's plan and table read."""

from __future__ import annotations

FINGERPRINT = {"method": "sha256-of-heads-v1", "files": [{"name": None, "bytes": 900, "sha256": "ab" * 32}]}


def report(
    shard: str,
    *,
    rows: int = 30,
    samples: int = 10,
    fingerprint=FINGERPRINT,
    ok: bool = True,
    dataset: str = "/data/train.jsonl",
    seconds: float | None = 3600.0,
) -> dict:
    """A host's `hsextract plan --json` report, with the fields the fleet's plan reads."""
    return {
        "dataset": dataset,
        "shard": shard,
        "format": "speculators",
        "rows": rows,
        "samples": samples,
        "tokens": samples * 100,
        "remaining_tokens": samples * 100,
        "dataset_fingerprint": fingerprint,
        "formats": {"speculators": {"remaining_bytes": samples * 1_000_000}},
        "output_volume": {"ok": ok, "free_bytes": 5_000_000_000 if ok else 1_000},
        "time": {"seconds": seconds},
    }


def status(
    *,
    state: str = "done",
    lines: int = 10,
    rejected: int = 1,
    in_set: int = 8,
    failed: int = 1,
    quarantined: int = 0,
    on_the_way: int = 0,
    tokens: int = 800,
    rate: float = 50.0,
    eta: float | None = 0.0,
    ok: bool = True,
) -> dict:
    """A host's `hsextract status --json`, with the fields the fleet's table reads."""
    accepted = lines - rejected
    return {
        "ok": ok,
        "why": "drain running, updated 1 s ago",
        "problems": [],
        "client": {"state": state, "tokens_per_s": rate, "eta_s": eta, "failed": failed},
        "dataset_lines": 20 if state == "done" else None,
        "drain": {"written": in_set, "tokens_total": tokens, "quarantined": quarantined},
        "accounts": {
            "lines": lines,
            "accepted": accepted,
            "rejected": {"empty": rejected},
            "in_set": in_set,
            "failed": {"capture_failed": failed} if failed else {},
            "quarantined": {},
            "on_the_way": on_the_way,
            "unaccounted": [],
            "final": state == "done",
        },
    }
