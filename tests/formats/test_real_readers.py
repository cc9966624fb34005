"""Real dumps from the real server, drained to each format, load with the trainers' OWN readers.

The readers accept bad data silently (wrong shapes pass, mismatched token ids are dropped, a
missing length falls back to a guess), so every test asserts shapes, dtypes, values, error
counts and lengths itself. Each reader runs in a subprocess with its own --target install.
"""

from __future__ import annotations

import pytest
import torch
from hsextract.formats import FORMATS
from hsextract.output.manifest import iter_entries, read_header, verify_entry
from hsextract.output.run_id import load_or_create_run_id
from support.drain_proc import drain_until_done
from support.reader_check import assert_reader_sees_captured, load_with_reader
from support.server_dumps import capture
from support.sglang_server import PRENORM_SGLANG_LAYERS

pytestmark = [pytest.mark.server, pytest.mark.readers, pytest.mark.timeout(900)]

N_SAMPLES = 12


@pytest.mark.parametrize("fmt", ["specforge", "speculators", "speculators-v1", "modelopt"])
def test_drained_real_dumps_load_with_the_trainers_reader(request, fmt, readers, tiny_llama, tmp_path):
    post_norm = FORMATS[fmt].final_hidden == "post_norm"
    # The pre-norm server captures the aux layers given in SGLang's convention (conftest.py): the
    # drain is told so, as the playbook tells it.
    server = request.getfixturevalue("llama_server" if post_norm else "llama_prenorm_server")
    layers = (
        [] if post_norm else ["--aux-layers", ",".join(map(str, PRENORM_SGLANG_LAYERS)), "--layer-convention", "sglang"]
    )
    dump, out = tmp_path / "dump", tmp_path / "out"
    run_id = load_or_create_run_id(out)
    captured = capture(server, dump, dump, run_id, list(range(N_SAMPLES)), seed=hash(fmt) % 1000)
    drain_until_done(dump, out, fmt, "--model", str(tiny_llama), *layers, lines=N_SAMPLES)
    header = read_header(out)
    assert header.format == fmt
    assert header.final_hidden == ("post_norm" if post_norm else "pre_norm")
    if post_norm:  # the default [1, L//2-1, L-4], L = 8
        assert (header.eagle_aux_hidden_state_layer_ids, header.sglang_layers_to_capture) == ([1, 3, 4], [2, 4, 5])
    else:
        assert (header.eagle_aux_hidden_state_layer_ids, header.sglang_layers_to_capture) == ([0, 2, 5], [1, 3, 6])
    assert all(verify_entry(out, e) is None for e in iter_entries(out))
    assert not [p for p in dump.iterdir() if p.name != "_records"] and not list((dump / "_records").iterdir())
    loaded = load_with_reader(readers, fmt, out, num_aux=3, hidden=64)
    assert_reader_sees_captured(fmt, out, loaded, captured)


def test_modelopt_files_hold_exactly_the_keys_of_its_dump_scripts(llama_server, tiny_llama, tmp_path):
    """ModelOpt's reader ignores keys it does not know and takes loss_mask only if present: pin them."""
    dump, out = tmp_path / "dump", tmp_path / "out"
    run_id = load_or_create_run_id(out)
    captured = capture(llama_server, dump, dump, run_id, [0, 1], seed=5)
    drain_until_done(dump, out, "modelopt", "--model", str(tiny_llama), lines=2)
    for e in iter_entries(out):
        assert e.file == f"{e.output_index}.pt"
        data = torch.load(out / e.file, weights_only=True)
        assert list(data) == ["input_ids", "hidden_states", "aux_hidden_states", "loss_mask", "conversation_id"]
        t = captured[e.dataset_index].input_ids.shape[0]
        assert data["conversation_id"] == e.dataset_index
        assert (data["input_ids"].dtype, data["loss_mask"].dtype) == (torch.int64, torch.int64)
        assert data["hidden_states"].shape == (t, 64) and data["aux_hidden_states"].shape == (t, 3 * 64)
        assert data["hidden_states"].dtype == data["aux_hidden_states"].dtype == torch.bfloat16
