"""What one extraction run is given: the settings of ``hsextract extract``, its flags declared once
(hsextract.options); hsextract.client.command builds them from its flags and the run configuration."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hsextract.client.backpressure import Watermark, parse_watermark
from hsextract.dataset import defaults
from hsextract.dataset.chat_template import OVERLONG_POLICIES, read_template_file
from hsextract.dataset.reader import MAX_ROW_BYTES_OPTION
from hsextract.formats import DEFAULT_FORMAT, DEFAULT_PRECISION, FORMAT_NAMES, PRECISION_OPTION
from hsextract.layers import parse_ids
from hsextract.objectstore.settings import WORK_DIR_OPTION
from hsextract.options import option
from hsextract.retry import RetryPolicy
from hsextract.shard import WHOLE, Shard

# Bytes a token's captured states take in staging, per hidden unit: K aux layers (EAGLE-3: 3) plus
# the final hidden state, 2 bytes each (bf16). Used only to reserve room for requests in flight.
STAGED_ELEM_BYTES = 2
RETRY = RetryPolicy()  # the client's retries are the policy's defaults


def _aux_count(text: str) -> int:
    """How many aux layers ``--aux-layers`` names (only their number matters to the client)."""
    ids = parse_ids(text)
    return len(ids) if ids else defaults.NUM_AUX


@dataclass
class ExtractConfig:
    """What one extraction run is given: its flags (each field with an `option`, in ``--help``'s
    order and groups), and the settings tests and benches set besides. The defaults of the CLI, of
    plan and check-shm and of the Ansible roles are `hsextract.dataset.defaults`'."""

    server: str = option(group="run", help="SGLang server base URL, e.g. http://127.0.0.1:30000")
    dataset: Path = option(
        group="run",
        help="dataset file or directory: JSONL (.gz, .zst), JSON array, Parquet, Arrow, "
        "save_to_disk; ShareGPT, OpenAI messages (tools, reasoning) or pre-tokenized rows",
        convert=Path,
    )
    model: Path = option(
        group="run", help="the served model's directory (its tokenizer and chat template are used)", convert=Path
    )
    dump_dir: Path = option(
        group="run", help="the capture's staging directory (records are written there too)", convert=Path
    )
    # A bucket's run works in its work directory (hsextract.objectstore.output): the command resolves it.
    output: Path = option(
        group="run",
        help="the training set's output directory (shared with the drain), or "
        "s3://bucket/prefix: then the client works in the drain's --work-dir",
    )
    work_dir: str | None = option(None, group="run", like=WORK_DIR_OPTION)
    format: str = option(
        DEFAULT_FORMAT,
        group="run",
        choices=FORMAT_NAMES,
        required=True,
        help="the training set's format (the drain's); the capture must stage what it needs",
    )
    # The drain's: the client only refuses one the format's reader cannot read, before it sends anything.
    precision: str = option(DEFAULT_PRECISION, group="run", like=PRECISION_OPTION)
    rid_prefix: str = option(
        defaults.RID_PREFIX, group="run", help=f"request id prefix the capture writes (default: {defaults.RID_PREFIX})"
    )
    # The template's text, read from the flag's file.
    chat_template: str | None = option(
        None,
        group="run",
        metavar="FILE",
        help="Jinja chat template to use instead of the tokenizer's",
        convert=read_template_file,
    )
    # The shard this process takes: --shard, narrowed by --process to its sub-shard (the command's).
    shard: Shard = option(
        WHOLE, group="run", parser_default="0/1", help="take samples with index %% n == i (i/n; default 0/1)"
    )
    process: str | None = option(
        None,
        group="run",
        metavar="J/P",
        help="run as client process j of P on this shard (default 0/1): one process may not keep a "
        "large server busy (data parallelism), so P processes on one output each take every Pth "
        "sample of the shard, the sub-shard (i + n*j)/(n*P), with one run id and exact accounts",
    )
    last_turn_only: bool = option(
        False,
        group="run",
        action="store_true",
        help="train on the last assistant turn only (conversations; a tokenized row keeps its mask)",
    )
    min_loss_tokens: int = option(
        0,
        group="run",
        type=int,
        help="reject samples with fewer trained-on tokens (reason too_few_loss_tokens; default 0)",
    )
    max_in_flight: int = option(
        defaults.MAX_IN_FLIGHT,
        group="limits",
        type=int,
        help=f"requests in flight at once (default {defaults.MAX_IN_FLIGHT})",
    )
    # None: defaults.MAX_TOKENS, or the longest prompt the server accepts if fewer.
    max_tokens: int | None = option(
        None,
        group="limits",
        type=int,
        help=f"longest sample in tokens (default {defaults.MAX_TOKENS}, or the longest prompt the "
        "server runs if fewer; a larger value is lowered to it)",
    )
    max_row_bytes: int = option(defaults.MAX_ROW_BYTES, group="limits", like=MAX_ROW_BYTES_OPTION)
    overlong: str = option(
        defaults.OVERLONG,
        group="limits",
        choices=OVERLONG_POLICIES,
        help=f"what to do with longer samples (default: {defaults.OVERLONG})",
    )
    shm_min_free: Watermark = option(
        default_factory=lambda: parse_watermark(defaults.SHM_MIN_FREE),
        group="limits",
        parser_default=str(parse_watermark(defaults.SHM_MIN_FREE)),
        help="pause while the dump dir's filesystem has less free space (bytes like 2G, or a "
        f"percentage; default {str(parse_watermark(defaults.SHM_MIN_FREE)).replace('%', '%%')})",
        convert=parse_watermark,
    )
    # Only sizes the staging reserve of requests in flight: the count of the flag's layer ids.
    num_aux: int = option(
        defaults.NUM_AUX,
        flag="--aux-layers",
        group="limits",
        parser_default=None,
        help="the capture's aux layer ids, e.g. 1,29,57 (only sizes the staging reserve; default: 3 layers)",
        convert=_aux_count,
    )
    max_staged: int | None = option(
        defaults.MAX_STAGED,
        group="limits",
        type=int,
        help=f"pause while staged dumps + requests in flight reach this many (0: no limit; default "
        f"{defaults.MAX_STAGED})",
        convert=lambda n: int(n) or None,
    )
    max_attempts: int = option(
        RETRY.max_attempts,
        group="retries",
        type=int,
        help=f"tries per sample while the server is up (default {RETRY.max_attempts})",
    )
    server_wait_s: float = option(
        RETRY.server_wait_s,
        flag="--server-wait",
        group="retries",
        type=float,
        help=f"seconds to wait for a down server before giving up (default {RETRY.server_wait_s:g})",
    )
    request_timeout_s: float = option(
        RETRY.read_timeout_s,
        flag="--request-timeout",
        group="retries",
        type=float,
        help="seconds without an answer before the client asks the server's /health: a healthy "
        "server keeps the request (waited on up to --server-wait), one that is not gets it again "
        f"once it is healthy (default {RETRY.read_timeout_s:g})",
    )
    # How long the start-up probe's dump may take to appear.
    probe_timeout_s: float = option(
        60.0,
        flag="--probe-timeout",
        group="retries",
        type=float,
        help="seconds the start-up probe's dump may take to appear in --dump-dir (default 60)",
    )
    # How long an answered sample may wait for its dump or failure marker.
    capture_timeout_s: float = option(
        120.0,
        flag="--capture-timeout",
        group="retries",
        type=float,
        help="seconds an answered sample may wait for its staged dump before it is sent again (default 120)",
    )
    log_every_s: float = option(
        30.0,
        flag="--log-every",
        group="progress",
        type=float,
        help="seconds between progress log lines off a terminal (default 30)",
    )
    # The --shard that --process splits into `shard` (None: `shard` itself): a run may not drop the
    # accounts of an earlier shard outside it (hsextract.client.start_state.check_earlier_shards).
    host_shard: Shard | None = None
    status_every_s: float = 1.0

    @property
    def retry(self) -> RetryPolicy:
        """How each request is tried again and a down server waited for (hsextract.retry)."""
        return RetryPolicy(
            max_attempts=self.max_attempts, server_wait_s=self.server_wait_s, read_timeout_s=self.request_timeout_s
        )
