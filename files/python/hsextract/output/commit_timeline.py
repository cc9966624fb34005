"""When the drain committed a run's samples, against the client's end: where a tail shows.

The manifest records each sample's commit time (``written_at``; the samples of one commit share
it). From it: the first and the last commit and how many there were, and, once every client has
finished, the commits after the client's end (the latest ``finished_at`` of the clients'
summaries) and how long after it the last one came. A drain that keeps level with the client
commits its last samples within a fraction of a second of the end; a run whose drain, or whose
self-check, set the pace commits for seconds after it (issue 50: 7-9 samples, the last 5-9 s
after the end, each waiting for its check). ``hsextract status`` shows it (``commits``), with the
self-check's queue beside it, which says whether the check is what the tail waits for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hsextract.output.client_files import ShardFiles, all_finished
from hsextract.output.manifest import ManifestEntry

# A last commit at least this long after the client's end is called a tail (issue 50's runs on the
# H100 host: none after the end with the self-check off; the last 2.4-9 s after it with it on).
TAIL_S = 1.0


@dataclass(frozen=True)
class CommitTimeline:
    samples: int
    commits: int
    first_at: float | None
    last_at: float | None
    client_end_at: float | None  # None while a client runs (or a summary has no finished_at)
    samples_after_client_end: int
    commits_after_client_end: int
    selfcheck_queue: dict[str, Any] | None = None  # the drain's (hsextract.drain.selfcheck), where it checks

    @property
    def last_after_client_end_s(self) -> float | None:
        """Seconds from the client's end to the last commit (negative: none came after it)."""
        if self.client_end_at is None or self.last_at is None:
            return None
        return self.last_at - self.client_end_at

    @property
    def tail(self) -> bool:
        """Whether the run's last commits waited seconds after the client's end."""
        after = self.last_after_client_end_s
        return after is not None and after >= TAIL_S

    def to_json(self) -> dict[str, Any]:
        after = self.last_after_client_end_s
        return {
            "samples": self.samples,
            "commits": self.commits,
            "first_at": self.first_at,
            "last_at": self.last_at,
            "client_end_at": self.client_end_at,
            "after_client_end": {
                "samples": self.samples_after_client_end,
                "commits": self.commits_after_client_end,
                "last_s": None if after is None else round(after, 3),
            },
            "tail": self.tail,
            "selfcheck_queue": self.selfcheck_queue,
        }


def client_end(shards: Iterable[ShardFiles]) -> float | None:
    """When the last client finished (its summary's ``finished_at``), once every client has; else None."""
    shards = list(shards)
    if not all_finished(shards):
        return None
    ends = [s.summary.finished_at for s in shards if s.summary is not None]
    if any(end is None for end in ends):
        return None
    return max(float(end) for end in ends if end is not None)


def commit_timeline(
    entries: Iterable[ManifestEntry], client_end_at: float | None, selfcheck_queue: dict[str, Any] | None = None
) -> CommitTimeline:
    """The timeline of the manifest's `entries` against the clients' end (None: not over)."""
    times: dict[float, int] = {}
    for e in entries:
        times[e.written_at] = times.get(e.written_at, 0) + 1
    after = {t: n for t, n in times.items() if client_end_at is not None and t > client_end_at}
    return CommitTimeline(
        samples=sum(times.values()),
        commits=len(times),
        first_at=min(times) if times else None,
        last_at=max(times) if times else None,
        client_end_at=client_end_at,
        samples_after_client_end=sum(after.values()),
        commits_after_client_end=len(after),
        selfcheck_queue=selfcheck_queue,
    )
