"""Which samples the self-check takes: the first few always, then its share by rid only while its
queue keeps up, every sample skipped for load counted, and the share actually checked reported."""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from hsextract.drain.check_queue import CheckRows
from hsextract.drain.selfcheck import GreedySelfCheck, in_share
from hsextract.greedy_check import GreedyHead
from support.head_model import logits, write_head_model

HIDDEN = 64


class HeldChecker:
    """A self-check whose checker thread the test holds inside the first pass's verdict: the samples
    submitted meanwhile wait in its queue, as they do behind a slow pass."""

    def __init__(self, model: Path, share: float, first: int, pass_rows: int):
        self.head = write_head_model(model, 512)
        self.check = GreedySelfCheck(GreedyHead(model), share=share, first=first, pass_rows=pass_rows)
        self.verdicts: dict[str, str] = {}
        self._busy, self._go = threading.Event(), threading.Event()

    def submit(self, rid: str, hold: bool = False) -> None:
        def settle(verdict):
            self.verdicts[rid] = verdict
            if hold:
                self._busy.set()
                self._go.wait(60)

        row = torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(len(self.verdicts))).to(torch.bfloat16)
        token = int(logits(self.head, row)[0].argmax())  # the server's token: the check passes
        rows = CheckRows(row.view(torch.uint8).numpy().tobytes(), "bfloat16", HIDDEN, (0,), "post_norm", token)
        self.check.submit(rid, rows, [1], settle)
        if hold:
            assert self._busy.wait(60), "the checker took the first sample"

    def finish(self) -> dict:
        self._go.set()
        self.check.close()
        return self.check.summary()


def _rids(share: float, inside: bool, n: int) -> list[str]:
    return [r for r in (f"hsx-run-{i}" for i in range(1000)) if in_share(r, share) == inside][:n]


def test_a_sample_of_the_share_is_skipped_while_a_pass_worth_waits_and_counted(tmp_path):
    held = HeldChecker(tmp_path / "model", share=0.5, first=1, pass_rows=2)
    first, *share = _rids(0.5, True, 4)
    outside = _rids(0.5, False, 1)[0]
    assert held.check.chosen(first), "the first sample seen is checked whatever its rid"
    held.submit(first, hold=True)
    for rid in share[:2]:  # two rows wait: a pass's worth
        assert held.check.chosen(rid)
        held.submit(rid)
    assert not held.check.chosen(share[2]), "a pass's worth waits: the next sample of the share goes unchecked"
    assert not held.check.chosen(outside)
    summary = held.finish()
    assert held.verdicts == {first: "passed", share[0]: "passed", share[1]: "passed"}
    assert summary["checked"] == 3 and summary["seen"] == 5 and summary["share_checked"] == 0.6
    assert summary["queue"] == {"waiting": 0, "running": 0, "done": 3, "passes": 2, "skipped_for_load": 1}


def test_a_share_of_one_checks_every_sample_whatever_waits(tmp_path):
    held = HeldChecker(tmp_path / "model", share=1.0, first=0, pass_rows=1)
    held.submit("hsx-run-0", hold=True)
    for i in range(1, 4):
        assert held.check.chosen(f"hsx-run-{i}")
        held.submit(f"hsx-run-{i}")
    summary = held.finish()
    assert summary["checked"] == 4 and summary["queue"]["skipped_for_load"] == 0


def test_an_fp8_sets_logprob_bound_is_fp8s_own_unless_one_is_given(tmp_path):
    from hsextract.drain.config import DrainConfig
    from hsextract.drain.selfcheck import make_selfcheck
    from hsextract.server_logprobs import DEFAULT_MAX_MEAN_ABS_ERROR, FP8_MAX_MEAN_ABS_ERROR

    write_head_model(tmp_path / "model", 64)

    def bound(**kw) -> float:
        model = str(tmp_path / "model")
        cfg = DrainConfig(
            dump_dir=tmp_path / "dump", output=tmp_path / "out", format="speculators", model_path=model, **kw
        )
        check = make_selfcheck(cfg)
        try:
            return check.bound
        finally:
            check.close()

    assert bound() == DEFAULT_MAX_MEAN_ABS_ERROR == 0.1
    assert bound(precision="fp8") == FP8_MAX_MEAN_ABS_ERROR == 0.25
    assert bound(precision="fp8", selfcheck_logprob_bound=0.12) == 0.12
