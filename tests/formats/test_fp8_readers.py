"""A set of FP8 rows written by the real drain from real dumps loads through the released reader:
hs_connectors 0.9's FP8Transfer (speculators' ``--hidden-states-backend fp8``) under speculators 0.9's
own training data path (ArrowDataset, `_setup_dataloader`'s collate function with ``shift_batch``).

The rows the trainer gets are our own dequantization of the drain's FP8 rows, bit for bit, and within
FP8's rounding of the rows the server captured. The drain checked every sample against the server
on those same dequantized rows (``--selfcheck-share 1`` with the logprob check) and quarantined none.
Without the backend (FileTransfer, the trainer's default) the reader would hand on the FP8 values
unscaled: docs/formats.md says to pass it.

Training on such a set is tests/formats/test_speculators_training.py: speculators 0.9's own
trainer, a few steps on a CPU, its losses against those of the same samples in bf16.
"""

from __future__ import annotations

import json

import pytest
import torch
from hsextract import fp8
from hsextract.output.manifest import iter_entries, read_header
from hsextract.output.run_id import load_or_create_run_id
from support.drain_proc import drain_until_done
from support.reader_check import load_with_reader
from support.server_dumps import capture
from support.sglang_server import PRENORM_SGLANG_LAYERS

pytestmark = [pytest.mark.server, pytest.mark.readers, pytest.mark.timeout(900)]

N_SAMPLES = 12
LAYERS = ["--aux-layers", ",".join(map(str, PRENORM_SGLANG_LAYERS)), "--layer-convention", "sglang"]


def test_an_fp8_set_from_real_dumps_loads_through_fp8transfer_as_our_dequantization(
    llama_prenorm_server, readers, tiny_llama, tmp_path
):
    server = llama_prenorm_server
    dump, out = tmp_path / "dump", tmp_path / "out"
    run_id = load_or_create_run_id(out)
    captured = capture(server, dump, dump, run_id, list(range(N_SAMPLES)), seed=52)
    checks = ["--selfcheck-share", "1", "--selfcheck-server", server.url]
    drain_until_done(
        dump, out, "speculators", "--model", str(tiny_llama), "--precision", "fp8", *LAYERS, *checks, lines=N_SAMPLES
    )
    assert read_header(out).precision == "fp8"
    status = json.loads((out / ".hsextract" / "drain-status.json").read_text())
    selfcheck = status["selfcheck"]
    assert status.get("quarantined_by_reason", {}) == {} and selfcheck["checked"] == N_SAMPLES, selfcheck
    assert selfcheck["logprob"]["compared"] == N_SAMPLES and selfcheck["logprob"]["failed"] == 0, selfcheck

    loaded = load_with_reader(readers, "speculators", out, num_aux=3, hidden=64, backend="fp8")
    assert loaded["transfer"] == "FP8Transfer" and loaded["modules"] == []
    assert loaded["error_records"] == 0 and loaded["batches"] >= 1
    entries = list(iter_entries(out))
    assert sorted(loaded["samples"]) == [e.output_index for e in entries]
    assert loaded["approx_lengths"] == [e.tokens for e in entries]
    worst = 0.0
    for e in entries:
        got, want = loaded["samples"][e.output_index], captured[e.dataset_index]
        t, slots, h = want.hidden.shape
        ours = fp8.dequantize(*fp8.quantize(want.hidden))
        assert got["hidden_states"].dtype == torch.bfloat16 and got["hidden_states"].shape == (t, (slots - 1) * h)
        assert torch.equal(got["hidden_states"], ours[:, :-1].reshape(t, -1)), "FP8Transfer's rows are ours"
        assert torch.equal(got["verifier_last_hidden_states"], ours[:, -1])
        assert torch.equal(got["input_ids"], want.input_ids) and torch.equal(got["loss_mask"].long(), want.loss_mask)
        amax = want.hidden.float().abs().amax(dim=(1, 2), keepdim=True)
        err = ((ours.float() - want.hidden.float()).abs() / amax).max().item()
        assert err <= 2**-4 + 2**-8, err  # half an e4m3 step of the token's largest value, and bf16's rounding
        worst = max(worst, err)
    assert worst > 2**-6, "the rows went through FP8"

    unscaled = load_with_reader(readers, "speculators", out, num_aux=3, hidden=64, backend="file")
    first = entries[0]
    assert not torch.equal(
        unscaled["samples"][first.output_index]["verifier_last_hidden_states"].to(torch.bfloat16),
        loaded["samples"][first.output_index]["verifier_last_hidden_states"],
    ), "without --hidden-states-backend fp8 the trainer gets the FP8 values unscaled"
