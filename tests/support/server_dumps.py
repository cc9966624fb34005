"""Real dumps from a real SGLang server: the client's part (record, then request), done by hand.

`capture` writes each sample's record into the drain's dump dir, sends the request with a rid
of the test's run, waits for the server's complete dump and moves it into `dest` (the drain's
dump dir, or a holding dir the test releases from). It returns what was captured, read back
from the staged file, for comparing with what the trainers' readers load.
"""

from __future__ import annotations

import random
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from hsextract.staging.dumps import DONE_FILE, read_states
from hsextract.staging.records import SampleRecord, make_rid, write_record

from support.staged_dumps import Staged


def wait_done(dump_dir: Path, rid: str, timeout: float = 60) -> Path:
    d = Path(dump_dir) / rid
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (d / DONE_FILE).exists():
            return d
        time.sleep(0.02)
    raise AssertionError(f"no complete dump for {rid} in {dump_dir} after {timeout} s")


def capture(
    server,
    records_dir: Path,
    dest: Path,
    run_id: str,
    indices: list[int],
    *,
    min_len: int = 4,
    max_len: int = 48,
    seed: int = 0,
    parallel: int = 4,
) -> dict[int, Staged]:
    """Send one request per dataset index through `server`; return {index: what the server captured}."""
    rng = random.Random(seed)
    plans = []
    for i in indices:
        n = rng.randint(min_len, max_len)
        ids = [rng.randrange(10, 300) for _ in range(n)]
        mask = [0] * (n // 2) + [1] * (n - n // 2)
        plans.append((i, ids, mask))
    dest.mkdir(parents=True, exist_ok=True)

    def one(plan: tuple[int, list[int], list[int]]) -> Staged:
        i, ids, mask = plan
        rid = make_rid(server.rid_prefix, run_id, i)
        write_record(records_dir, SampleRecord(rid=rid, index=i, input_ids=ids, loss_mask=mask, run_id=run_id))
        out = server.generate(ids, rid=rid)
        assert out["meta_info"]["prompt_tokens"] == len(ids), out["meta_info"]
        d = wait_done(server.dump_dir, rid)
        target = dest / rid
        shutil.move(str(d), str(target))
        st = read_states(target)
        return Staged(rid, i, torch.tensor(ids), torch.tensor(mask), st.hidden.clone())

    with ThreadPoolExecutor(parallel) as pool:
        got = list(pool.map(one, plans))
    return {s.index: s for s in got}
