"""Checks the capture makes before it switches on: the server's settings, the SGLang release and
the dump directory. Every problem is found before the first request, and one failed start lists
all of them, so a misconfigured server never runs a day of requests whose states are wrong or
partial. Pure functions of SGLang's ServerArgs (read through `ServerFacts`) and the filesystem.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.capture.ranks import attention_dp_size
from hsextract.errors import ConfigError
from hsextract.staging.fs import prepare_root

log = logging.getLogger("hsextract.capture")


@dataclass(frozen=True)
class ServerFacts:
    """The server settings the capture depends on (from SGLang's ServerArgs)."""

    device: str = "cuda"
    disable_radix_cache: bool = False
    pp_size: int = 1
    attn_cp_size: int = 1
    prefill_cuda_graph_disabled: bool = False
    attention_backend: str | None = None
    tp_size: int = 1
    attn_dp_size: int = 1
    port: int = 0

    @classmethod
    def from_server_args(cls, sa: Any) -> ServerFacts:
        backend = getattr(sa, "cuda_graph_backend_prefill", None)
        prefill_off = bool(
            getattr(sa, "disable_prefill_cuda_graph", False)
            or getattr(sa, "disable_cuda_graph", False)
            or backend == "disabled"
        )
        return cls(
            device=str(getattr(sa, "device", None) or "cuda"),
            disable_radix_cache=bool(getattr(sa, "disable_radix_cache", False)),
            pp_size=int(getattr(sa, "pp_size", 1) or 1),
            attn_cp_size=int(getattr(sa, "attn_cp_size", 1) or 1),
            prefill_cuda_graph_disabled=prefill_off,
            attention_backend=getattr(sa, "attention_backend", None),
            tp_size=int(getattr(sa, "tp_size", 1) or 1),
            port=int(getattr(sa, "port", 0) or 0),
            attn_dp_size=attention_dp_size(
                attn_dp_size=int(getattr(sa, "attn_dp_size", 1) or 1),
                dp_size=int(getattr(sa, "dp_size", 1) or 1),
                enable_dp_attention=bool(getattr(sa, "enable_dp_attention", False)),
            ),
        )


def check_server(facts: ServerFacts) -> None:
    """Refuse server settings under which the capture would write wrong or partial samples."""
    problems = []
    if not facts.disable_radix_cache:
        problems.append(
            "the radix (prefix) cache is on: cached prompt prefixes are never run, so their hidden "
            "states cannot be captured; start the server with --disable-radix-cache"
        )
    if facts.pp_size > 1:
        problems.append(
            f"pipeline parallelism is on (pp_size={facts.pp_size}): earlier stages' layers are not "
            "captured on the last stage; use --pp-size 1 (tensor parallelism is fine)"
        )
    if facts.attn_cp_size > 1:
        problems.append(
            f"attention context parallelism is on (attn_cp_size={facts.attn_cp_size}): rows are "
            "sharded by position; use --attn-cp-size 1"
        )
    if facts.device != "cpu" and not facts.prefill_cuda_graph_disabled:
        problems.append(
            "prefill CUDA graphs are on (the 0.5.23 default): the capture must see every prefill "
            "eagerly; start the server with --disable-prefill-cuda-graph"
        )
    if problems:
        raise ConfigError("hidden-state capture cannot run with this server configuration: " + "; ".join(problems))


def check_dump_dir(dump_dir: str | Path) -> Path:
    """Create the dump directory if needed (mode 0700), refuse one another user could have filled
    (`hsextract.staging.fs`), prove it is writable, or raise saying how to fix it."""
    return prepare_root(dump_dir, what="dump directory")


def sglang_version() -> str:
    try:
        import sglang

        return str(sglang.__version__)
    except Exception:
        return ""


# SGLang releases whose model internals (ForwardBatch fields, layers_to_capture, the aux packer)
# the capture was written and tested against. Another release may move them silently.
TESTED_SGLANG_VERSIONS: tuple[str, ...] = ("0.5.23",)
ALLOW_UNTESTED_ENV = "HSEXTRACT_ALLOW_UNTESTED_SGLANG"


def check_sglang_version(version: str, allow_untested: bool | None = None) -> None:
    """Refuse an SGLang release the capture was not tested on, unless the operator opts in."""
    if version in TESTED_SGLANG_VERSIONS:
        return
    if allow_untested is None:
        allow_untested = os.environ.get(ALLOW_UNTESTED_ENV, "") == "1"
    tested = ", ".join(TESTED_SGLANG_VERSIONS)
    if allow_untested:
        log.warning(
            "hsextract capture: SGLang %s is untested (tested: %s); %s=1 is set, going on; check the "
            "smoke test's self-check before trusting the dumps",
            version or "of unknown version",
            tested,
            ALLOW_UNTESTED_ENV,
        )
        return
    raise ConfigError(
        f"SGLang {version or '(version unknown)'} is not a release the capture was tested on ({tested}); install "
        f"sglang=={TESTED_SGLANG_VERSIONS[-1]} in the server's venv (requirements/ml-env.lock), or set "
        f"{ALLOW_UNTESTED_ENV}=1 in the server's environment to try it and rely on the smoke test's self-check"
    )
