"""What one extraction run is given: the settings of ``hsextract extract`` (hsextract.client.command
builds them from its flags and the run configuration)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hsextract.client.backpressure import Watermark, parse_watermark
from hsextract.dataset import defaults
from hsextract.formats import DEFAULT_FORMAT
from hsextract.retry import RetryPolicy
from hsextract.shard import WHOLE, Shard

# Bytes a token's captured states take in staging, per hidden unit: K aux layers (EAGLE-3: 3) plus
# the final hidden state, 2 bytes each (bf16). Used only to reserve room for requests in flight.
STAGED_ELEM_BYTES = 2


@dataclass
class ExtractConfig:
    server: str
    dataset: Path
    model: Path
    dump_dir: Path
    output: Path
    format: str = DEFAULT_FORMAT
    # The defaults of the CLI, of plan and check-shm and of the Ansible roles: `hsextract.dataset.defaults`.
    rid_prefix: str = defaults.RID_PREFIX
    max_in_flight: int = defaults.MAX_IN_FLIGHT
    max_tokens: int | None = None  # None: defaults.MAX_TOKENS, or the longest prompt the server accepts if fewer
    overlong: str = defaults.OVERLONG
    shard: Shard = WHOLE
    shm_min_free: Watermark = field(default_factory=lambda: parse_watermark(defaults.SHM_MIN_FREE))
    max_staged: int | None = defaults.MAX_STAGED
    max_row_bytes: int = defaults.MAX_ROW_BYTES
    chat_template: str | None = None
    last_turn_only: bool = False
    min_loss_tokens: int = 0
    num_aux: int = defaults.NUM_AUX  # only sizes the staging reserve of requests in flight
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    capture_timeout_s: float = 120.0  # how long an answered sample may wait for its dump or failure marker
    probe_timeout_s: float = 60.0  # how long the start-up probe's dump may take to appear
    status_every_s: float = 1.0
    log_every_s: float = 30.0
