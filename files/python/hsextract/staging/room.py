"""The staging room a run needs: what the captured states of the requests in flight cost in /dev/shm.

The capture stages every request's hidden states in RAM until the drain has written them, so the
run's staging filesystem must hold the requests in flight (or the staged limit, if larger) x tokens
per request x bytes per token, where a token costs ``hidden_size x (aux layers + 1) x dtype bytes``
plus its 8-byte id (a capture that stages FP8 rows: one byte an element, plus the id and its 4-byte
scale, `hsextract.staging.dumps.StateFileLayout`), and each request also costs a few pages (header,
done marker, record). The
model is pure: ``hsextract check-shm`` (hsextract.ops.check_shm) checks a host against it, and
``hsextract plan`` sizes a run with it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from hsextract.dataset import defaults
from hsextract.errors import ConfigError
from hsextract.staging.dumps import DTYPE_BYTES, STAGED_PRECISIONS

PAGE = 4096
PAGES_PER_REQUEST = 3  # states file header page, done.json, the client's record


@dataclass(frozen=True)
class ShmNeed:
    """What a run needs on the staging filesystem, with the parts that explain the figure."""

    bytes_per_token: int
    tokens_in_flight: int
    estimate_bytes: int
    watermark_bytes: int

    @property
    def need_bytes(self) -> int:
        return max(self.estimate_bytes, self.watermark_bytes)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)?\s*$", re.IGNORECASE)


def parse_size(text: str | int | None, total: int) -> int:
    """Parse "512M", "2GiB", "1073741824" or "10%" (of ``total``) into bytes; None/"" is 0."""
    if text is None or text == "":
        return 0
    if isinstance(text, int):
        return text
    s = str(text).strip()
    if s.endswith("%"):
        try:
            pct = float(s[:-1])
        except ValueError:
            raise ConfigError(f"size {text!r}: expected a percentage such as 10%") from None
        if not 0 <= pct <= 100:
            raise ConfigError(f"size {text!r}: a percentage must lie in 0..100")
        return int(total * pct / 100)
    m = _SIZE.match(s)
    if not m:
        raise ConfigError(f"size {text!r}: expected bytes, a size such as 512M or 2G, or a percentage such as 10%")
    factor = 1024 ** " kmgt".index((m.group(2) or " ").lower())
    return int(float(m.group(1)) * factor)


def estimate_need(
    *,
    hidden_size: int,
    aux_layers: int,
    requests_in_flight: int,
    tokens_per_request: int,
    watermark_bytes: int = 0,
    dtype: str = "bfloat16",
    precision: str = "bf16",
) -> ShmNeed:
    """The staging space of ``requests_in_flight`` requests of ``tokens_per_request`` tokens each, their
    rows staged as computed (`dtype`) or, with the capture's ``precision`` fp8, as FP8 rows and scales."""
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"dtype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
    if precision not in STAGED_PRECISIONS:
        raise ConfigError(f"capture precision {precision!r}: expected one of {', '.join(STAGED_PRECISIONS)}")
    for name, value in (
        ("hidden size", hidden_size),
        ("requests in flight", requests_in_flight),
        ("tokens per request", tokens_per_request),
    ):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if aux_layers < 1:
        raise ConfigError(f"aux layers must be >= 1, got {aux_layers}")
    fp8 = precision == "fp8"
    per_token = hidden_size * (aux_layers + 1) * (1 if fp8 else DTYPE_BYTES[dtype]) + 8 + (4 if fp8 else 0)
    tokens = requests_in_flight * tokens_per_request
    estimate = tokens * per_token + requests_in_flight * PAGES_PER_REQUEST * PAGE
    return ShmNeed(per_token, tokens, estimate, watermark_bytes)


def mount_point(path: str) -> str:
    """The mount point holding ``path`` (what `mount -o remount,size=` needs)."""
    p = os.path.realpath(path)
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    return p


def aux_count(aux: object) -> int:
    """The number of aux layers of ``--aux-layers`` (ids, or a list of them); the default without."""
    if aux in (None, "", []):
        return defaults.NUM_AUX
    if isinstance(aux, list):
        return len(aux)
    from hsextract.layers import parse_ids

    ids = parse_ids(str(aux))
    return len(ids) if ids else defaults.NUM_AUX
