"""What one regeneration run is given: the settings of ``hsextract regenerate``, its flags declared
once (hsextract.options); hsextract.regen.command builds them from its flags and the run configuration."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.dataset import defaults
from hsextract.dataset.reader import MAX_ROW_BYTES_OPTION
from hsextract.options import option
from hsextract.output.layout import REGEN_OUTPUT, STATE_DIR
from hsextract.regen.reasoning import MODES
from hsextract.regen.sampling import DEFAULT_MAX_NEW_TOKENS
from hsextract.retry import RetryPolicy
from hsextract.shard import WHOLE, Shard

# The read timeout of a reply: one of thousands of tokens behind a full batch takes minutes.
REPLY_TIMEOUT_S = 1800.0
SAMPLING = "sampling (default: the model's generation_config.json, else greedy)"


def _servers(given: Any) -> list[str]:
    """``--server`` (repeated), or the config file's one URL or list."""
    return [str(s) for s in (given if isinstance(given, list) else [given])]


@dataclass
class RegenConfig:
    """A regeneration run's settings: its flags (each field with an `option`, in ``--help``'s order
    and groups), and those tests and benches set besides."""

    dataset: Path = option(
        group="run",
        help="what hsextract extract reads: a file or directory of JSONL (.gz, .zst), JSON "
        "arrays, Parquet, Arrow or save_to_disk; a row without a reply gets one",
        convert=Path,
    )
    # Its own config key: a shared run configuration's "output" is the training set, not this.
    output: Path = option(
        group="run",
        dest="regen_output",
        help=f"directory of the regenerated dataset ({REGEN_OUTPUT}; state in {STATE_DIR}/); config key regen_output",
        convert=Path,
    )
    servers: list[str] = option(
        flag="--server",
        group="run",
        action="append",
        help="SGLang server base URL; repeat to spread the run over several servers",
        convert=_servers,
    )
    model: Path | None = option(
        None,
        group="run",
        help="the served model's directory, for the sampling defaults of its "
        "generation_config.json (default: the path the server names, when it exists here)",
        convert=Path,
    )
    shard: Shard = option(
        WHOLE,
        group="run",
        parser_default="0/1",
        help="take rows with index %% n == i (i/n; default 0/1)",
        convert=lambda text: Shard.parse(text, where="--shard"),
    )
    max_row_bytes: int = option(defaults.MAX_ROW_BYTES, group="run", like=MAX_ROW_BYTES_OPTION)
    last_turn_only: bool = option(
        False, group="turns", action="store_true", help="regenerate only the last assistant turn"
    )
    reasoning: str = option(
        "strip-history",
        group="turns",
        choices=MODES,
        help="keep: reasoning stays in the history of later turns; strip-history (default): it is stored "
        "but not sent back; disable: thinking off (enable_thinking: false)",
    )
    drop_truncated: bool = option(
        False,
        group="turns",
        action="store_true",
        help="cut a conversation before a reply that hit the token limit (default: keep it, marked)",
    )
    temperature: float | None = option(None, group=SAMPLING, type=float)
    top_p: float | None = option(None, group=SAMPLING, type=float)
    top_k: int | None = option(None, group=SAMPLING, type=int)
    max_new_tokens: int | None = option(
        None,
        group=SAMPLING,
        type=int,
        parser_default=DEFAULT_MAX_NEW_TOKENS,
        help=f"longest reply (default {DEFAULT_MAX_NEW_TOKENS}, at most the context)",
    )
    concurrency: int = option(64, group="requests", type=int, help="conversations in flight per server (default 64)")
    max_attempts: int = option(5, group="requests", type=int, help="tries per turn while the server is up (default 5)")
    server_wait_s: float = option(
        3600.0,
        flag="--server-wait",
        group="requests",
        type=float,
        help="seconds to wait for a down server before giving it up (default 3600)",
    )
    # A reply of thousands of tokens behind a full batch takes minutes.
    request_timeout_s: float = option(
        REPLY_TIMEOUT_S,
        flag="--request-timeout",
        group="requests",
        type=float,
        help=f"seconds to wait for one reply (default {REPLY_TIMEOUT_S:.0f})",
    )
    log_every_s: float = option(
        30.0,
        flag="--log-every",
        group="progress",
        type=float,
        help="seconds between progress log lines off a terminal",
    )
    status_every_s: float = 1.0

    @property
    def retry(self) -> RetryPolicy:
        """How each turn is tried again and a down server waited for (hsextract.retry)."""
        return RetryPolicy(
            max_attempts=self.max_attempts, server_wait_s=self.server_wait_s, read_timeout_s=self.request_timeout_s
        )
