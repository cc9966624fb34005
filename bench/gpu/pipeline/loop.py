"""The comparison the product is measured against: a plain asyncio loop sending the same encoded
prompts (prefill, one greedy token), to the plain server and to the capture servers, where a
stand-in drain checks each dump: what the server itself can do, with and without the capture."""

from __future__ import annotations

import asyncio
import secrets

from gpu_server import ServerHandle


def run_plain_loop(url: str, prompts: list[list[int]], in_flight: int) -> dict:
    """The comparison: the same requests (prefill, one greedy token) from a plain asyncio loop (the
    overhead bench's, with rids outside any capture's prefix)."""
    from capture_server_gpu import _send

    return loop_rate(prompts, asyncio.run(_send(url, secrets.token_hex(4), prompts, in_flight, rid_prefix="plain")))


def loop_rate(prompts: list[list[int]], wall: float) -> dict:
    """What one round of a plain loop sent, and at what rate."""
    tokens = sum(map(len, prompts))
    return {
        "samples": len(prompts),
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
    }


def run_loop_on_capture(server: ServerHandle, prompts: list[list[int]], in_flight: int) -> dict:
    """The plain loop against a capture server, its requests captured: the server's own pace with the
    capture (no client bookkeeping, no drain). A stand-in drain in a process of its own checks each
    dump's ids and fingerprint and removes it."""
    from capture_server_gpu import StagingCounter, _send

    run_id = secrets.token_hex(4)
    counter = StagingCounter(server.dump_dir, run_id, prompts, remove=True)
    counter.start()
    wall = asyncio.run(_send(server.url, run_id, prompts, in_flight, rid_prefix="hsx"))
    counter.wait_for(len(prompts))
    return {
        **loop_rate(prompts, wall),
        "complete_dumps": counter.complete,
        "wrong_dumps": counter.wrong,
        "failure_markers": counter.failed,
        "ok": counter.complete == len(prompts) and not counter.wrong and not counter.failed,
    }
