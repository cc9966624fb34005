"""This host's share of the dataset: shard ``i/n`` takes the samples whose index % n == i.

`Shard` is the one owner of the concept: the one parser of ``i/n`` (the CLIs' ``--shard``, the
Ansible role's ``hsextract_shard``, the fleet plan's host entries), the one membership test, the
one size, and the forms a shard is written in (``i/n`` for people, ``[i, n]`` in JSON files, and
``.shard-i-of-n`` in file names, hsextract.output.layout).

Standard library only (and `hsextract.errors`): the Ansible role checks ``hsextract_shard`` with
this parser on the controller, whose Python has neither torch nor SGLang, so the play refuses in
seconds what the client, the plan and the regeneration would refuse after the environment is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hsextract.errors import ConfigError


@dataclass(frozen=True, order=True)
class Shard:
    """Shard ``index/count``: the dataset indices x with x % count == index (0 <= index < count).

    Ordered as the pair (index, count), so sorted shards read as they did when they were tuples.
    Constructing one checks it: a Shard that exists is one that can take samples.
    """

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ConfigError(f"shard '{self.index}/{self.count}': need 0 <= i < n")

    @classmethod
    def parse(cls, text: object, where: str = "") -> Shard:
        """``"i/n"`` -> Shard(i, n); a ConfigError naming the text (and `where` it came from, e.g.
        ``--shard`` or ``host b``, as a prefix) when it is not i/n with 0 <= i < n."""
        prefix = f"{where}: " if where else ""
        try:
            i_s, n_s = str(text).split("/")
            i, n = int(i_s), int(n_s)
        except ValueError:
            raise ConfigError(f"{prefix}shard {text!r}: expected i/n, e.g. 0/4 for the first of four hosts") from None
        if n < 1 or not 0 <= i < n:
            raise ConfigError(f"{prefix}shard {text!r}: need 0 <= i < n")
        return cls(i, n)

    @classmethod
    def from_json(cls, value: Any) -> Shard:
        """The shard a JSON file stores: ``[i, n]`` (status files, summaries, lock files) or ``"i/n"``
        (the regeneration's summary, plan reports); a ConfigError when it is neither."""
        if isinstance(value, str):
            return cls.parse(value)
        if (
            isinstance(value, (list, tuple))
            and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            return cls(value[0], value[1])
        raise ConfigError(f'shard {value!r}: expected [i, n] or "i/n"')

    def to_json(self) -> list[int]:
        """``[i, n]``: how status files, summaries and lock files store a shard."""
        return [self.index, self.count]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def takes(self, dataset_index: int) -> bool:
        """Whether the sample of dataset index `dataset_index` belongs to this shard."""
        return dataset_index % self.count == self.index

    def indices(self, rows: int) -> range:
        """The dataset indices of this shard in a dataset of `rows` rows, ascending."""
        return range(self.index, rows, self.count)

    def size(self, rows: int) -> int:
        """How many of a dataset's `rows` this shard takes."""
        return len(self.indices(rows))

    def overlaps(self, other: Shard) -> bool:
        """Whether some dataset index belongs to both shards: x ≡ i (mod n) and x ≡ j (mod m) have a
        common solution iff i ≡ j (mod gcd(n, m)) (the Chinese remainder theorem)."""
        return (self.index - other.index) % math.gcd(self.count, other.count) == 0

    def contains(self, other: Shard) -> bool:
        """Whether every dataset index of `other` belongs to this shard: x ≡ j (mod m) implies
        x ≡ i (mod n) iff n divides m and j ≡ i (mod n)."""
        return other.count % self.count == 0 and other.index % self.count == self.index

    def sub_shard(self, process: tuple[int, int]) -> Shard:
        """The shard of client process j of P on this host shard k/N: (k + N*j) / (N*P).

        One client process may not keep a large host busy (a server with data parallelism 8 takes far
        more requests than one process tokenizes), so P processes split the host's shard among
        themselves. An index x of shard k/N is x = k + N*m; it falls to the process j = m % P, which
        holds exactly the x with x % (N*P) == k + N*j. The P sub-shards are therefore disjoint and
        together exactly the host's shard, and each is a plain shard i/n that the client, its locks,
        its files and the reconciliation already understand.
        """
        j, p = check_process(*process)
        return Shard(self.index + self.count * j, self.count * p)


WHOLE = Shard(0, 1)  # the whole dataset: what a client without --shard takes


def parse_process(text: str) -> tuple[int, int]:
    """``"j/P"`` -> (j, P): client process j of the P that share one host's shard (``--process``)."""
    try:
        j_s, p_s = str(text).split("/")
        j, p = int(j_s), int(p_s)
    except ValueError:
        raise ConfigError(f"process {text!r}: expected j/P, e.g. 1/4 for the second of four client processes") from None
    return check_process(j, p)


def check_process(j: int, p: int) -> tuple[int, int]:
    """(j, P) if client process j of P can exist, else a ConfigError that says which bound it breaks."""
    if p < 1:
        raise ConfigError(f"process {j}/{p}: need at least one client process (P >= 1), got P={p}")
    if not 0 <= j < p:
        raise ConfigError(f"process {j}/{p}: the process index must be 0 <= j < P={p}, got j={j}")
    return j, p
