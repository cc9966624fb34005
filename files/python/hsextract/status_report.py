"""The object ``hsextract status --json`` prints for a drain's run, typed.

`hsextract.status` writes it and the fleet's status reads it from every host
(hsextract.fleet.status_input checks it, hsextract.fleet.status reads it): one record with one
`to_json`, so its keys are spelled once and keep the order and values they had as an inline dict.
A set made by ``hsextract collect`` prints its own object (hsextract.status_collected).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hsextract.output.accounts import Accounts
    from hsextract.output.run_files import DrainStatus


@dataclass(frozen=True)
class StatusReport:
    """A run's status, as ``hsextract status`` judged it."""

    ok: bool  # the exit status's verdict: the drain is healthy and nothing is a problem
    why: str  # the drain's health, in words
    problems: list[str]
    drain: DrainStatus | None  # None: no drain status file
    client: dict[str, Any] | None  # every client's status as one (hsextract.output.client_files.combined_status)
    # The dataset's size as the finished clients counted it (a fleet's hosts sum their shards to it);
    # None until they have, or when they disagree.
    dataset_lines: int | None
    accounts: Accounts | None  # the run's reconciliation; None before every client gave its shard's size
    # (samples the dataset-level files cover, samples in the set); None where the drain does not say.
    dataset_files: tuple[int, int] | None

    def to_json(self) -> dict[str, Any]:
        files = self.dataset_files
        return {
            "ok": self.ok,
            "why": self.why,
            "problems": list(self.problems),
            "drain": self.drain.to_json() if self.drain else None,
            "client": self.client,
            "dataset_lines": self.dataset_lines,
            "accounts": self.accounts.as_dict() if self.accounts else None,
            "dataset_files": None
            if files is None
            else {"samples": files[0], "of": files[1], "current": files[0] == files[1]},
        }
