"""Write staged dumps and client records exactly as the capture and the client do (for tests without a server).

`stage_sample` uses the staging contract (`StateFileLayout`: header, rows at their offsets, ids;
then the atomic done marker) and the records contract (`write_record`), so the drain cannot tell
these dumps from the server's. Real-server dumps are used by the end-to-end tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from hsextract import fingerprint
from hsextract.staging.dumps import (
    DONE_FILE,
    DoneMarker,
    StateFileLayout,
    read_done_marker,
    read_states,
    write_done_marker,
)
from hsextract.staging.records import SampleRecord, make_rid, write_record

EAGLE_IDS = [1, 3, 4]
HIDDEN = 64


@dataclass
class Staged:
    rid: str
    index: int
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    hidden: torch.Tensor  # [T, K + 1, H]


def write_states(path: Path, hidden: torch.Tensor, ids: torch.Tensor) -> None:
    layout = StateFileLayout(prompt_len=hidden.shape[0], num_slots=hidden.shape[1], hidden_size=hidden.shape[2])
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, layout.file_size)
        os.pwrite(fd, layout.header, 0)
        if hidden.shape[0]:
            os.pwrite(fd, hidden.contiguous().view(torch.uint8).numpy().tobytes(), layout.hidden_offset(0))
            os.pwrite(fd, ids.numpy().tobytes(), layout.ids_offset(0))
    finally:
        os.close(fd)


def stage_sample(
    dump_dir: Path,
    run_id: str,
    index: int,
    tokens: int = 12,
    *,
    hidden_size: int = HIDDEN,
    eagle_ids: list[int] | None = None,
    final_hidden: str = "pre_norm",
    seed: int | None = None,
    done: bool = True,
    record: bool = True,
    prefix: str = "hsx",
) -> Staged:
    eagle = list(EAGLE_IDS if eagle_ids is None else eagle_ids)
    g = torch.Generator().manual_seed(index if seed is None else seed)
    rid = make_rid(prefix, run_id, index)
    ids = torch.randint(0, 1000, (tokens,), generator=g, dtype=torch.int64)
    mask = (torch.arange(tokens) >= tokens // 2).to(torch.int64)
    hidden = torch.randn(tokens, len(eagle) + 1, hidden_size, generator=g).bfloat16()
    d = Path(dump_dir) / rid
    d.mkdir(parents=True, exist_ok=True)
    if record:
        write_record(
            dump_dir, SampleRecord(rid=rid, index=index, input_ids=ids.tolist(), loss_mask=mask.tolist(), run_id=run_id)
        )
    write_states(d / "states.safetensors", hidden, ids)
    staged = Staged(rid, index, ids, mask, hidden)
    if done:
        mark_done(dump_dir, staged, eagle_ids=eagle, final_hidden=final_hidden)
    return staged


def mark_done(
    dump_dir: Path,
    staged: Staged,
    *,
    eagle_ids: list[int] | None = None,
    final_hidden: str = "pre_norm",
    greedy_token: int = -1,
) -> None:
    """Write the done marker of a sample staged with ``done=False``, as the capture does once every
    row is staged; ``greedy_token`` is the token the server sampled (-1: none recorded)."""
    eagle = list(EAGLE_IDS if eagle_ids is None else eagle_ids)
    tokens, _, hidden_size = staged.hidden.shape
    write_done_marker(
        dump_dir,
        DoneMarker(
            rid=staged.rid,
            prompt_len=tokens,
            num_aux=len(eagle),
            hidden_size=hidden_size,
            dtype="bfloat16",
            eagle_aux_hidden_state_layer_ids=eagle,
            sglang_layers_to_capture=[i + 1 for i in eagle],
            num_hidden_layers=8,
            final_hidden=final_hidden,
            architecture="LlamaForCausalLM",
            chunks=[[0, tokens]],
            model_path="tiny",
            sglang_version="0.5.23",
            fingerprint=fingerprint.of_states(staged.hidden, staged.input_ids),
            greedy_token=greedy_token,
        ),
    )


def restamp_fingerprint(d: Path) -> None:
    """Give the dump in ``d`` the fingerprint of its rows as they are now: what the capture writes
    when the forward pass itself computed them (a NaN the model produced, say)."""
    marker = read_done_marker(d)
    states = read_states(d)
    marker.fingerprint = fingerprint.of_states(states.hidden, states.input_ids)
    (d / DONE_FILE).unlink()
    write_done_marker(d.parent, marker)
