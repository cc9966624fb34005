"""Reading a staged dump maps tmpfs's own pages: a 64 MB sample costs no process memory."""

from __future__ import annotations

import torch
from hsextract.drain.staged_io import map_states
from hsextract.records import load_or_create_run_id
from support.staged_dumps import stage_sample


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


def test_mapping_a_staged_dump_copies_none_of_its_rows(tmp_path):
    run = load_or_create_run_id(tmp_path / "out")
    staged = stage_sample(tmp_path / "dump", run, 0, tokens=8192, hidden_size=1024)  # 64 MiB of rows
    before = _rss_anon_kib()
    mapped = map_states(tmp_path / "dump" / staged.rid / "states.safetensors")
    try:
        assert torch.equal(mapped.states.hidden, staged.hidden)  # every page read
        grown_mib = (_rss_anon_kib() - before) / 1024
        assert grown_mib < 8, f"mapping a 64 MiB dump grew private memory by {grown_mib:.0f} MiB"
    finally:
        mapped.close()
