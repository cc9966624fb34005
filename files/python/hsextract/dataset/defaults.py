"""The defaults of a client run: the one source of every subcommand that sends, sizes or checks one.

``hsextract extract`` sends the samples, ``hsextract plan`` sizes the run before it starts and
``hsextract check-shm`` checks its staging room; all three describe the same run, so a limit left
at its default must be the same number in each, or a plan or a check made by hand would size
another run than the one the client then makes. `ExtractConfig` (the client), the CLI flags of
the three subcommands and the Ansible roles' defaults (roles/hsextract/defaults/main.yml, held
equal by a test) all take their values from here.
"""

from __future__ import annotations

# 32 requests in flight keep a server's prefill batches full at 1-4K-token prompts (measured on
# the H200 with 64).
MAX_IN_FLIGHT = 32
# 256 staged dumps are a few seconds of the drain's work at Kimi width: long enough to ride out its
# fsyncs, short enough to notice it stalled.
MAX_STAGED = 256
# The client pauses while the staging filesystem has less free space than this.
SHM_MIN_FREE = "10%"
# The longest sample (the drafter trainers' usual maximum), unless the server accepts fewer tokens.
MAX_TOKENS = 4096
OVERLONG = "truncate"
RID_PREFIX = "hsx"
# EAGLE-3 captures three aux layers; only sizes the staging estimates.
NUM_AUX = 3
# A row longer than this (a JSON text's bytes, a table row's characters) is rejected before it is
# parsed: parsing and rendering it costs several times its size. (Tokenizing a whole row with
# offsets cost a few hundred bytes per byte, 17 GB for a 50 MB line; the encoder now tokenizes only
# as far as the length limit needs: hsextract.dataset.head_tokens.) 8 MiB is some 2 million tokens
# of text, far beyond any context.
MAX_ROW_BYTES = 8 << 20
