"""What the capture keeps past the hook is its own: SGLang may write its buffers for the next batch.

SGLang 0.5.23 runs prefill from static input buffers (its eager runner copies each batch's ids into
a fixed int64 buffer) and writes the next batch into them as soon as the forward is done. A host
copy queued on a side stream that reads such a buffer stages another batch's ids. The CPU tests
guard the rule in CI (no storage shared with SGLang's tensors); the CUDA test shows the race it
prevents: the sources are overwritten on the forward stream right after the hook, and the host copy
must still hold what the forward pass computed.
"""

from __future__ import annotations

import pytest
import torch
from hsextract import fingerprint
from hsextract.capture.core import BatchRequest, CaptureSettings
from hsextract.capture.host_stage import HostBufferPool, HostStager, greedy_tokens, own_batch
from hsextract.layers import resolve

H = 16
K = 3


def settings(hidden: int = H) -> CaptureSettings:
    return CaptureSettings(
        rid_prefix="hsx", layers=resolve(None, 8), hidden_size=hidden, architecture="LlamaForCausalLM"
    )


def sglang_like_batch(rows: int, hidden: int = H, device: str = "cpu"):
    """Tensors shaped and typed as SGLang passes them: packed aux, int64 ids in a larger static
    buffer, int64 prompt lengths."""
    g = torch.Generator().manual_seed(rows)
    aux = torch.randn(rows, K * hidden, generator=g).to(torch.bfloat16).to(device)
    final = torch.randn(rows, hidden, generator=g).to(torch.bfloat16).to(device)
    static_ids = torch.randint(0, 300, (rows + 64,), generator=g).to(device)  # int64, like SGLang's slot
    lens = torch.tensor([rows], dtype=torch.int64).to(device)
    return aux, final, static_ids, lens


def storages(*tensors: torch.Tensor) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def test_nothing_the_capture_keeps_shares_storage_with_what_sglang_passed_in():
    aux, final, static_ids, lens = sglang_like_batch(24)
    batch = own_batch(settings(), [BatchRequest("hsx-ab12cd34-0", 0, 0, 24, 0)], aux, final, static_ids, lens)
    kept = storages(batch.block, batch.ids, batch.prompt_lens, batch.row_values)
    assert not kept & storages(aux, final, static_ids, lens)
    assert len(kept) == 4, "each kept tensor has its own storage"


def test_nothing_kept_shares_storage_when_the_aux_states_come_as_a_list():
    aux, final, static_ids, lens = sglang_like_batch(8)
    parts = list(aux.view(8, K, H).unbind(1))
    batch = own_batch(settings(), [BatchRequest("hsx-ab12cd34-0", 0, 0, 8, 0)], parts, final, static_ids, lens)
    assert not storages(batch.block, batch.ids, batch.prompt_lens) & storages(*parts, final, static_ids, lens)


def test_the_kept_batch_holds_the_values_of_the_hook_time_after_sglang_reuses_its_buffers():
    aux, final, static_ids, lens = sglang_like_batch(24)
    want_ids = static_ids[:24].clone()
    want_rows = torch.cat([aux.view(24, K, H), final.view(24, 1, H)], 1)
    batch = own_batch(settings(), [BatchRequest("hsx-ab12cd34-0", 0, 0, 24, 0)], aux, final, static_ids, lens)
    static_ids.fill_(-1)  # the next batch, written into SGLang's buffers
    aux.zero_()
    lens.fill_(3)
    assert torch.equal(batch.ids, want_ids) and torch.equal(batch.block, want_rows)
    assert batch.prompt_lens.tolist() == [24]


def test_row_values_are_the_fingerprint_of_the_kept_rows_and_ids():
    aux, final, static_ids, lens = sglang_like_batch(24)
    batch = own_batch(settings(), [BatchRequest("hsx-ab12cd34-0", 0, 0, 24, 0)], aux, final, static_ids, lens)
    want = fingerprint.row_values_np(batch.block.view(torch.uint8).numpy(), batch.ids.numpy(), (K + 1) * H * 2)
    assert batch.row_values.tolist() == want.tolist()


def test_greedy_tokens_are_the_argmax_of_each_requests_logits_and_none_when_rows_do_not_match():
    logits = torch.tensor([[0.1, 2.0, 0.3], [5.0, 1.0, 0.0]])
    assert greedy_tokens(logits, 2).tolist() == [1, 0]
    assert greedy_tokens(logits, 3) is None, "a row per request or nothing"
    assert greedy_tokens(None, 2) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_overwriting_the_sources_right_after_the_hook_leaves_the_host_copy_intact():
    """The GPU race itself: a large block queued on the side stream ahead of the ids, and the
    sources overwritten on the forward stream at once. Before the capture owned its ids, the ids'
    copy ran after the overwrite and landed -1s."""
    rows, hidden = 8192, 4096  # 256 MiB of rows: their copy to the host takes a while
    aux, final, static_ids, lens = sglang_like_batch(rows, hidden, device="cuda")
    want_ids = static_ids[:rows].cpu()
    want_rows = torch.cat([aux.view(rows, K, hidden), final.view(rows, 1, hidden)], 1).cpu()
    s = settings(hidden)
    stager = HostStager(s, torch.device("cuda", 0), HostBufferPool(1 << 30, pin=True))
    req = [BatchRequest("hsx-ab12cd34-0", 0, 0, rows, 0)]
    for _ in range(3):
        batch = own_batch(s, req, aux, final, static_ids, lens)
        staged = stager.stage(batch, torch.tensor([7], device="cuda"))
        del batch
        static_ids.fill_(-1)  # the next batch, on the forward stream, right after the hook
        aux.zero_()
        final.zero_()
        staged.event.synchronize()
        host_rows = staged.buf[: rows * staged.row_bytes].view(torch.bfloat16).view(rows, K + 1, hidden)
        assert torch.equal(staged.ids, want_ids), "the ids are the hook time's"
        assert torch.equal(host_rows, want_rows), "the rows are the hook time's"
        assert staged.greedy_tokens.tolist() == [7] and staged.prompt_lens.tolist() == [rows]
        got = fingerprint.row_values_np(host_rows.view(torch.uint8).numpy(), staged.ids.numpy(), staged.row_bytes)
        assert got.tolist() == staged.row_values.tolist(), "the device's row values match the host copy"
        stager.pool.release(staged.buf)
        static_ids[:rows].copy_(want_ids.cuda())
        aux.copy_(want_rows[:, :K].reshape(rows, K * hidden).cuda())
        final.copy_(want_rows[:, K].cuda())
