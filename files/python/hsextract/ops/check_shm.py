"""``hsextract check-shm``: does the staging filesystem (/dev/shm) have the room a run needs?

The capture stages every request's hidden states in RAM until the drain has written them. If the
ramdisk fills, the capture's writes fail and samples are lost, so the play checks before starting:

* the estimate: requests in flight (or the staged limit, if larger) x tokens per
  request x bytes per token, where a token costs ``hidden_size x (aux layers + 1) x dtype bytes``
  plus its 8-byte id, and each request also costs a few pages (header, done marker, record);
* the watermark: the client pauses while free space is below it (``--shm-min-free``), so with less
  free space than that the run could never start.

The run needs ``max(estimate, watermark)`` free; otherwise the command fails with the numbers and
what to change. Output: one JSON object (``ok``, ``free_bytes``, ``need_bytes`` and the parts).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict

from hsextract.config_file import add_config_argument
from hsextract.dataset import defaults
from hsextract.errors import ConfigError, HsextractError
from hsextract.formats import CAPTURE_PRECISION_OPTION
from hsextract.staging.dumps import DTYPE_BYTES
from hsextract.staging.room import ShmNeed, aux_count, estimate_need, mount_point, parse_size
from hsextract.units import binary_size


class ShmTooSmall(HsextractError):
    """The staging filesystem has less free space than the run needs."""

    exit_code = 4


def verdict_message(path: str, free: int, total: int, need: ShmNeed, requests: int, per_request: int) -> str:
    mount = mount_point(path)
    return (
        f"{path} has {binary_size(free)} free (of {binary_size(total)}), "
        f"but the run needs {binary_size(need.need_bytes)}: "
        f"the estimate is {requests} staged requests x {per_request} tokens x "
        f"{need.bytes_per_token} bytes per token "
        f"= {binary_size(need.estimate_bytes)}, "
        f"the client's free-space watermark is {binary_size(need.watermark_bytes)}. "
        f"Fix one of: enlarge {mount} (mount -o remount,size=... {mount}, or more RAM), remove stale dumps there, "
        f"lower the requests in flight (--max-in-flight), the staged limit (--max-staged) or the tokens "
        f"per request (--max-tokens), "
        f"or lower the watermark (--shm-min-free)."
    )


def check(path: str, need: ShmNeed, requests: int, per_request: int, *, statvfs=os.statvfs) -> dict:
    st = statvfs(path)
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    report = {
        "path": path,
        "free_bytes": free,
        "total_bytes": total,
        "need_bytes": need.need_bytes,
        "ok": free >= need.need_bytes,
        "changed": False,
        **asdict(need),
    }
    if not report["ok"]:
        raise ShmTooSmall(verdict_message(path, free, total, need, requests, per_request))
    return report


# ---- CLI ----------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dump-dir", default="/dev/shm", help="staging dir; its filesystem is checked (default /dev/shm)"
    )
    parser.add_argument("--model", help="model dir: the hidden size is read from its config.json")
    parser.add_argument("--hidden-size", type=int, help="hidden size, instead of --model")
    parser.add_argument("--aux-layers", help="aux layer ids (e.g. 1,29,57); only their number matters here (default 3)")
    # The client's defaults (`hsextract.dataset.defaults`): a check by hand sizes the run the client makes.
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=defaults.MAX_IN_FLIGHT,
        help=f"requests the client keeps in flight (default {defaults.MAX_IN_FLIGHT})",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help=f"longest request in tokens (default {defaults.MAX_TOKENS}, or the longest prompt the "
        "server runs for --model if fewer)",
    )
    parser.add_argument(
        "--max-staged",
        type=int,
        default=defaults.MAX_STAGED,
        help="the client pauses while staged dumps + requests in flight reach this many (0: no limit, "
        f"then only --max-in-flight counts; default {defaults.MAX_STAGED})",
    )
    parser.add_argument(
        "--shm-min-free",
        default=defaults.SHM_MIN_FREE,
        help="the client's free-space watermark: bytes, 512M, 2G or a percentage "
        f"(default {defaults.SHM_MIN_FREE.replace('%', '%%')})",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES), help="dtype of the captured states")
    spec = CAPTURE_PRECISION_OPTION
    parser.add_argument(spec.flag_of(""), dest=spec.dest, default="bf16", choices=spec.choices, help=spec.help)
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    if args.hidden_size is None and not args.model:
        raise ConfigError("check-shm needs --model (to read the hidden size) or --hidden-size")
    hidden = args.hidden_size
    max_tokens = args.max_tokens if args.max_tokens is not None else defaults.MAX_TOKENS
    if args.model:
        from hsextract.model_info import read_model_info
        from hsextract.prompt_limit import longest_prompt, resolve_max_tokens

        info = read_model_info(args.model)
        hidden = info.hidden_size if hidden is None else hidden
        max_tokens = resolve_max_tokens(
            args.max_tokens,
            defaults.MAX_TOKENS,
            longest_prompt(info.context_length),
            f"a context of {info.context_length}",
        )
    path = args.dump_dir
    probe = path
    while not os.path.isdir(probe):  # the dump dir may not exist yet: check the filesystem it will live on
        parent = os.path.dirname(probe.rstrip("/")) or "/"
        if parent == probe:
            break
        probe = parent
    st = os.statvfs(probe)
    watermark = parse_size(args.shm_min_free, st.f_blocks * st.f_frsize)
    # The client's --max-staged bounds staged dumps and requests in flight together.
    requests = max(args.max_in_flight, args.max_staged or 0)
    need = estimate_need(
        hidden_size=hidden,
        aux_layers=aux_count(args.aux_layers),
        requests_in_flight=requests,
        tokens_per_request=max_tokens,
        watermark_bytes=watermark,
        dtype=args.dtype,
        precision=args.capture_precision,
    )
    print(json.dumps(check(probe, need, requests, max_tokens)))
    return 0
