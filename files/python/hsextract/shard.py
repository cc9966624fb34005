"""This host's share of the dataset: shard ``i/n`` takes the samples whose index % n == i.

Standard library only (and `hsextract.errors`): the Ansible role checks ``hsextract_shard`` with
this parser on the controller, whose Python has neither torch nor SGLang, so the play refuses in
seconds what the client, the plan and the regeneration would refuse after the environment is built.
"""

from __future__ import annotations

from hsextract.errors import ConfigError


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` -> (i, n) with 0 <= i < n."""
    try:
        i_s, n_s = str(text).split("/")
        i, n = int(i_s), int(n_s)
    except ValueError:
        raise ConfigError(f"shard {text!r}: expected i/n, e.g. 0/4 for the first of four hosts") from None
    return _check_shard(i, n, repr(text))


def _check_shard(i: int, n: int, shown: str) -> tuple[int, int]:
    """(i, n) if shard i/n can exist, else a ConfigError naming it as `shown`."""
    if n < 1 or not 0 <= i < n:
        raise ConfigError(f"shard {shown}: need 0 <= i < n")
    return i, n


def shard_size(rows: int, shard: tuple[int, int]) -> int:
    """How many of a dataset's `rows` the shard ``(i, n)`` takes."""
    i, n = shard
    return len(range(i, rows, n))


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


def sub_shard(shard: tuple[int, int], process: tuple[int, int]) -> tuple[int, int]:
    """The shard of client process j of P on the host shard k/N: (k + N*j) / (N*P).

    One client process may not keep a large host busy (a server with data parallelism 8 takes far
    more requests than one process tokenizes), so P processes split the host's shard among
    themselves. An index x of shard k/N is x = k + N*m; it falls to the process j = m % P, which
    holds exactly the x with x % (N*P) == k + N*j. The P sub-shards are therefore disjoint and
    together exactly the host's shard, and each is a plain shard i/n that the client, its locks,
    its files and the reconciliation already understand.
    """
    j, p = check_process(*process)
    k, n = _check_shard(*shard, f"{shard[0]}/{shard[1]}")
    return k + n * j, n * p
