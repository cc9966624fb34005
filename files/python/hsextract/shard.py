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
    if n < 1 or not 0 <= i < n:
        raise ConfigError(f"shard {text!r}: need 0 <= i < n")
    return i, n


def shard_size(rows: int, shard: tuple[int, int]) -> int:
    """How many of a dataset's `rows` the shard ``(i, n)`` takes."""
    i, n = shard
    return len(range(i, rows, n))
