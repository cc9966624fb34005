"""The GPU test tier's parts that run without a GPU: the bundle, the stand-ins, the staging counts, the
self-check's logprob numbers the tier records (against the suite's CPU server)."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "bench" / "gpu"
STANDIN = GPU / "standin"
sys.path[:0] = [str(GPU), str(REPO / "bench")]

import capture_checks  # noqa: E402
from capture_server_gpu import StagingCounter, round_order, scheduler_stats, server_of  # noqa: E402
from hsextract.output.run_id import load_or_create_run_id  # noqa: E402
from support.drain_proc import env as hsextract_env  # noqa: E402
from support.drain_proc import finish_client  # noqa: E402
from support.server_dumps import capture, wait_done  # noqa: E402
from support.staged_dumps import stage_sample  # noqa: E402


def _load(name: str, path: Path) -> types.ModuleType:
    """A module of the stand-in directory by file, under ``name``: the directory itself is not put on
    sys.path, where its sgl_kernel would shadow SGLang's CPU fallbacks in this process."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


hsextract_gpu_standin = _load("hsextract_gpu_standin", STANDIN / "hsextract_gpu_standin.py")


def _load_standin_kernels() -> types.ModuleType:
    return _load("standin_sgl_kernel", STANDIN / "sgl_kernel" / "__init__.py")


def _moe(num_tokens: int, dtype: torch.dtype):
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig

    g = torch.Generator().manual_seed(0)
    experts, hidden, inter, top_k = 8, 64, 32, 2
    layer = types.SimpleNamespace(
        w13_weight=(torch.randn(experts, 2 * inter, hidden, generator=g) * 0.1).to(dtype),
        w2_weight=(torch.randn(experts, hidden, inter, generator=g) * 0.1).to(dtype),
        num_experts=experts,
    )
    x = torch.randn(num_tokens, hidden, generator=g).to(dtype)
    logits = torch.randn(num_tokens, experts, generator=g)
    weights, ids = torch.topk(logits.sigmoid(), top_k)
    return layer, x, (weights, ids.to(torch.int32), logits), MoeRunnerConfig(activation="silu")


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_graph_safe_moe_computes_what_sglangs_native_moe_computes(dtype, tol):
    from sglang.srt.layers.moe.fused_moe_native import moe_forward_native

    layer, x, topk, cfg = _moe(37, dtype)
    want = moe_forward_native(layer, x, topk, cfg).float()
    got = hsextract_gpu_standin.gathered_moe(layer, x, topk, cfg).float()
    assert hsextract_gpu_standin.gathered_moe_supports(layer, cfg)
    assert float((got - want).norm() / want.norm()) < tol


def test_eager_moe_calls_keep_sglangs_own_path():
    layer, x, topk, cfg = _moe(5, torch.float32)
    calls = []
    hsextract_gpu_standin.moe_forward_native_graph_safe(lambda *a: calls.append(a) or "sglang", layer, x, topk, cfg)
    assert len(calls) == 1


def test_sglang_loads_the_plugin_and_wraps_its_native_moe():
    probe = (
        "from sglang.srt.plugins import load_plugins; load_plugins(); "
        "import sglang.srt.layers.moe.fused_moe_native as m; f = m.moe_forward_native; "
        "print(f.__wrapped__.__module__, f is not f.__wrapped__)"
    )
    # The tests' CPU sgl_kernel stub first, as on the CPU test servers; the plugin is found beside it.
    path = [REPO / "tests" / "stubs", STANDIN, REPO / "files" / "python"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path)), "SGLANG_PLUGINS": "hsextract_graph_safe_moe"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["sglang.srt.layers.moe.fused_moe_native", "True"], done.stdout


def test_standin_kernels_fail_naming_themselves_when_called():
    k = _load_standin_kernels()
    with pytest.raises(NotImplementedError, match=r"standin_sgl_kernel\.moe_align_block_size"):
        k.moe_align_block_size(None)
    sub = importlib.import_module("standin_sgl_kernel.kvcacheio")
    with pytest.raises(NotImplementedError, match=r"kvcacheio\.transfer_kv_direct"):
        sub.transfer_kv_direct()


def test_bundle_carries_a_complete_package_whose_patch_renders(tmp_path, tiny_llama):
    out = tmp_path / "bundle"
    done = subprocess.run(
        [sys.executable, str(GPU / "build_bundle.py"), "--out", str(out), "--with-tree", "--offline"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["tree"] and summary["bundle_mib"] < 5
    templates = out / "tree" / "files" / "python" / "hsextract" / "data" / "capture_patch"
    assert not templates.is_symlink() and (templates / "model.py.j2").is_file()
    assert (out / "standin" / "hsextract_gpu_standin-1.0.dist-info" / "entry_points.txt").is_file()
    env = {k: v for k, v in os.environ.items() if k != "HSEXTRACT_TEMPLATES"}
    env["PYTHONPATH"] = str(out / "tree" / "files" / "python")
    render = subprocess.run(
        [
            sys.executable,
            "-m",
            "hsextract",
            "capture-patch",
            "--out-dir",
            str(tmp_path / "patch"),
            "--model",
            str(tiny_llama),
            "--dump-dir",
            str(tmp_path / "dump"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert render.returncode == 0, render.stderr
    assert (tmp_path / "patch" / "hsextract_capture_patch" / "model.py").is_file()


def test_the_bundles_tree_carries_the_pipeline_bench_package_and_its_command_runs(tmp_path):
    """The end-to-end bench is a package beside its script: a tree copied into the bundle must hold
    both, so that the GPU host can run the documented command from it."""
    out = tmp_path / "bundle"
    done = subprocess.run(
        [sys.executable, str(GPU / "build_bundle.py"), "--out", str(out), "--with-tree", "--offline"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    script = out / "tree" / "bench" / "gpu" / "pipeline_gpu.py"
    assert sorted(p.name for p in script.with_name("pipeline").glob("*.py")) == sorted(
        p.name for p in (GPU / "pipeline").glob("*.py")
    )
    helped = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert helped.returncode == 0, helped.stderr
    assert "--throughput-in-flight" in helped.stdout and "--reap-output" in helped.stdout


@pytest.mark.parametrize("writer_process", [False, True])
def test_a_capture_server_spec_renders_its_writer_mode_into_the_patch(tmp_path, tiny_llama, writer_process):
    from gpu_server import ServerSpec, render_capture_patch

    spec = ServerSpec("bench-capture", tiny_llama, 30301, writer_threads=3, writer_process=writer_process)
    init = (render_capture_patch(spec, tmp_path) / "hsextract_capture_patch" / "__init__.py").read_text()
    namespace: dict = {}
    exec(init, namespace)
    assert namespace["CONFIG"]["writer_threads"] == 3
    assert namespace["CONFIG"].get("writer_process", True) is writer_process


def stage_round(
    dump: Path, run_id: str, n: int, failed: set[int] = frozenset(), incomplete: set[int] = frozenset()
) -> list[list[int]]:
    """``n`` staged dumps of one round as the capture writes them (ids, rows, fingerprint), some
    failed or incomplete; the prompts their requests sent."""
    prompts = []
    for i in range(n):
        staged = stage_sample(dump, run_id, i, tokens=8, record=False, done=i not in failed | incomplete)
        prompts.append(staged.input_ids.tolist())
        if i in failed:
            (dump / staged.rid / capture_checks.FAILED_FILE).write_text("{}")
    return prompts


def test_staging_counter_counts_this_rounds_valid_dumps_and_failure_markers(tmp_path):
    prompts = stage_round(tmp_path, "aaaa0001", 4, failed={2}, incomplete={3})
    stage_round(tmp_path, "bbbb0002", 1)  # another round's
    counter = StagingCounter(tmp_path, "aaaa0001", prompts)
    counter.sweep()
    size = (tmp_path / "hsx-bbbb0002-0" / "states.safetensors").stat().st_size
    assert (counter.complete, counter.failed, counter.wrong, counter.staged_bytes) == (2, 1, 0, 2 * size)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hsx-aaaa0001-3", "hsx-bbbb0002-0"]


def test_staging_counter_counts_a_dump_of_other_ids_or_other_rows_as_wrong(tmp_path):
    """The bench's drain stand-in validates what it counts: a dump holding another request's ids, or
    rows other than those the forward pass fingerprinted, is not a complete dump of its round."""
    prompts = stage_round(tmp_path, "eeee0005", 3)
    prompts[0] = prompts[0][::-1]  # the request sent other ids than the dump holds
    states = tmp_path / "hsx-eeee0005-1" / "states.safetensors"
    data = bytearray(states.read_bytes())
    data[-200] ^= 0xFF  # a byte of the rows changed after the forward pass
    states.write_bytes(bytes(data))
    counter = StagingCounter(tmp_path, "eeee0005", prompts)
    counter.sweep()
    assert (counter.complete, counter.wrong) == (1, 2)


def test_staging_counter_in_its_own_process_counts_every_dump_of_a_round(tmp_path):
    """The bench's drain stand-in runs beside the client in a process of its own, as the drain does."""
    made, watched = tmp_path / "made", tmp_path / "staging"
    watched.mkdir()
    prompts = stage_round(made, "cccc0003", 40, failed={0, 10, 20, 30})  # the round's requests, known up front
    counter = StagingCounter(watched, "cccc0003", prompts)
    counter.start()
    for d in sorted(made.iterdir()):  # the dumps arrive while it runs
        if d.name.startswith("hsx-"):
            d.rename(watched / d.name)
    counter.wait_for(40)
    assert (counter.complete, counter.wrong, counter.failed) == (36, 0, 4)
    assert list(watched.iterdir()) == []


def test_staging_counter_that_keeps_dumps_counts_each_once_and_removes_them_after_the_round(tmp_path):
    prompts = stage_round(tmp_path, "dddd0004", 3)
    counter = StagingCounter(tmp_path, "dddd0004", prompts, remove=False)
    counter.sweep()
    counter.sweep()  # the dumps are still there: not counted again
    assert counter.complete == 3
    assert len(list(tmp_path.iterdir())) == 3
    counter.remove_all()
    assert list(tmp_path.iterdir()) == []


# Three prefill batches as SGLang 0.5.23 logs them on the H200, and a line of another kind.
SGLANG_PREFILL_LOG = (
    "\n".join(
        f"[2026-12-01 10:22:11] Prefill batch, #new-seq: {seqs}, #new-token: {tokens}, #cached-token: 0, "
        f"token usage: 0.03, #running-req: {running}, #queue-req: {queued}, #pending-token: 0, cuda graph: False, "
        f"input throughput (token/s): {throughput}"
        for seqs, tokens, running, queued, throughput in (
            (64, 8192, 1, 0, "41392.10"),
            (35, 4480, 64, 0, "42920.74"),
            (1, 128, 35, 12, "1100.43"),
        )
    )
    + "\n[2026-12-01 10:22:11] hsextract capture: another line\n"
)


def test_scheduler_stats_read_sglangs_prefill_lines_of_a_round():
    stats = scheduler_stats(SGLANG_PREFILL_LOG)
    assert stats["batches"] == 3
    assert stats["median_new_seq"] == 35
    assert stats["empty_queue_share"] == round(2 / 3, 3)
    assert stats["median_gap_ms"] == round(1000 * 128 / 1100.43, 1)  # 116.3 ms: 104.4, 116.3, 197.9
    assert stats["max_gap_ms"] == round(1000 * 8192 / 41392.10, 1)
    assert scheduler_stats("no prefill here") == {"batches": 0}


def test_each_side_is_timed_on_its_server():
    assert [
        server_of(side)
        for side in ("plain", "capture", "capture-kept", "capture-server-uncaptured", "capture-other-writer")
    ] == ["plain", "capture", "capture", "capture", "capture-other-writer"]


def test_every_side_leads_some_round_and_each_round_times_every_side_once():
    sides = ("plain", "capture", "capture-server-uncaptured")
    orders = [round_order(sides, r) for r in range(3)]
    assert {o[0] for o in orders} == set(sides)
    assert all(sorted(o) == sorted(sides) for o in orders)
    assert round_order(sides[:2], 0) == ("plain", "capture") and round_order(sides[:2], 1) == ("capture", "plain")


def test_chunks_must_cover_the_prompt_once_in_order():
    assert capture_checks.chunk_problems([[0, 128], [128, 128], [256, 44]], 300) == []
    assert capture_checks.chunk_problems([[0, 128], [0, 128], [128, 172]], 300)  # a chunk written twice
    assert capture_checks.chunk_problems([[0, 128], [128, 100]], 300)  # rows missing
    assert capture_checks.chunk_problems([[0, 300]], 300)  # longer than a chunk, yet one chunk


def _flag(parallel: tuple[str, ...], name: str) -> int:
    return int(parallel[parallel.index(name) + 1]) if name in parallel else 1


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_every_gpu_configuration_splits_its_model_whole_and_names_a_reference_of_the_same_model(gpus):
    from hsextract.tiny_model import model_config

    configs = {c.name: c for c in capture_checks.gpu_configs(gpus)}
    for cfg in configs.values():
        model = model_config(cfg.kind)
        tp, dp = _flag(cfg.parallel, "--tp"), _flag(cfg.parallel, "--dp")
        attn_tp = tp // dp if "--enable-dp-attention" in cfg.parallel else tp
        assert len(cfg.gpus) == tp == cfg.ranks and max(cfg.gpus) < gpus, cfg
        assert cfg.writers == (dp if "--enable-dp-attention" in cfg.parallel else 1), cfg
        heads = model.num_attention_heads
        assert heads % attn_tp == 0, f"{cfg.name}: {heads} heads at attention TP {attn_tp}"
        for width in ("intermediate_size", "moe_intermediate_size", "vocab_size"):
            if hasattr(model, width):
                assert getattr(model, width) % tp == 0, f"{cfg.name}: {width} {getattr(model, width)} at TP {tp}"
        if cfg.reference:
            assert configs[cfg.reference].kind == cfg.kind and configs[cfg.reference].ranks == 1, cfg


@pytest.mark.parametrize("gpus", [1, 2])
def test_every_gpu_machine_checks_the_in_process_writers_rows_against_the_default_writer_process(gpus):
    configs = capture_checks.gpu_configs(gpus)
    [cfg] = [c for c in configs if not c.writer_process]
    assert cfg.reference == "llama-tp1" and cfg.kind == "llama"
    assert next(c for c in configs if c.name == "llama-tp1").writer_process


def test_eight_gpus_add_tp8_alone_and_with_dp_attention_8_and_4():
    names = {c.name for c in capture_checks.gpu_configs(8)} - {c.name for c in capture_checks.gpu_configs(2)}
    assert names == {"dsv3h8-tp1", "dsv3h8-tp8", "dsv3h8-tp8-dpattn8", "dsv3h8-tp8-dpattn4"}


def test_the_tp8_model_runs_a_forward_pass_in_transformers(tmp_path):
    from hsextract.tiny_model import make_tiny_model
    from transformers import AutoModelForCausalLM

    path = make_tiny_model("dsv3-gpu8", tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    out = model(torch.tensor([[5, 6, 7, 8]]), output_hidden_states=True)
    assert out.logits.shape == (1, 4, model.config.vocab_size)
    assert torch.isfinite(out.logits).all()


def test_the_bench_models_tokenizer_spells_every_token_the_model_can_generate(tmp_path, tiny_llama):
    """Regeneration's GPU bench re-sends each reply as text: any generated id must decode to text
    that encodes back to the same id, inside the tiny model's chat template."""
    import gen_llama8b
    from transformers import AutoTokenizer

    gen_llama8b.write_word_tokenizer(tmp_path, tiny_llama, 2000)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    tiny = AutoTokenizer.from_pretrained(str(tiny_llama))
    assert len(tok) == 2000
    ids = list(range(7, 2000))
    assert tok.encode(tok.decode(ids), add_special_tokens=False) == ids
    history = [{"role": "user", "content": "w10 w11"}, {"role": "assistant", "content": tok.decode([1500, 7])}]
    assert tok.apply_chat_template(history, tokenize=False) == tiny.apply_chat_template(history, tokenize=False)
    assert tok.convert_tokens_to_ids(["<s>", "</s>", "<|user|>", "<|assistant|>"]) == tiny.convert_tokens_to_ids(
        ["<s>", "</s>", "<|user|>", "<|assistant|>"]
    )


def test_a_throughput_case_says_where_the_set_was_written_and_the_whole_pipeline_over_the_disks_ceiling():
    """Issue 40's keys: the whole pipeline (the drain up first, as the units run it) over min(the
    plain loop's tokens/s, the ceiling's bytes/s over the bytes per token)."""
    import pipeline_gpu

    rows = {
        "plain_loop": [{"tokens_per_s": 1000.0, "samples": 10, "wall_s": 1.0}],
        "pipeline_drain_first": [
            {"pipeline_tokens_per_s": 900.0, "samples": 10, "pipeline_wall_s": 1.0, "drain_gb_per_s": 0.5, "ok": True}
        ],
    }
    fast_disk = pipeline_gpu.case_result(32, rows, 2.0, output_root="/data/out", bytes_per_token=1e6)
    assert {
        k: fast_disk[k]
        for k in (
            "output_root",
            "reaped",
            "disk_ceiling_gb_per_s",
            "drain_gb_per_s",
            "whole_pipeline_on_disk_over_ceiling",
        )
    } == {
        "output_root": "/data/out",
        "reaped": False,
        "disk_ceiling_gb_per_s": 2.0,
        "drain_gb_per_s": 0.5,
        "whole_pipeline_on_disk_over_ceiling": 0.9,
    }  # the GPU binds: 900 / 1000
    slow_disk = pipeline_gpu.case_result(32, rows, 0.5, output_root="/data/out", bytes_per_token=1e6)
    assert slow_disk["whole_pipeline_on_disk_over_ceiling"] == 1.8  # the disk binds: 900 / 500


def test_the_ceilings_files_are_the_runs_samples_at_their_length_quantiles():
    import pipeline_gpu

    sizes = pipeline_gpu.ceiling_sizes([[0] * n for n in range(1, 101)], 32_768)
    assert sizes == sorted(sizes) and len(sizes) == 9 and sizes[-1] == 91 * 32_768 and sizes[0] == 11 * 32_768


@pytest.mark.parametrize(
    ("side", "processes", "drain_after", "drain_first"),
    [
        ("pipeline", 1, False, False),
        ("pipeline_2_processes", 2, False, False),
        ("client_alone", 1, True, False),
        ("pipeline_drain_first", 1, False, True),
        ("pipeline_drain_first_fp8", 1, False, True),
        ("pipeline_drain_first_fp8_capture", 1, False, True),
    ],
)
def test_each_product_side_runs_its_case_as_its_name_says(tmp_path, side, processes, drain_after, drain_first):
    from pipeline.case import Case

    base = Case(tmp_path / "model", tmp_path / "data.jsonl", tmp_path / "bench-32", 32, 2032)
    run = base.for_side(side, tmp_path / f"bench-32-0-{side}", reap=True)
    assert (run.processes, run.drain_after, run.drain_first) == (processes, drain_after, drain_first)
    assert (run.in_flight, run.dataset, run.out, run.selfcheck_share, run.reap) == (
        32,
        base.dataset,
        tmp_path / f"bench-32-0-{side}",
        0.01,
        True,
    )


def test_the_fp8_sides_run_the_drain_and_the_client_in_fp8_and_their_twin_in_bf16(tmp_path):
    from pipeline.processes import client_command, drain_command

    server = types.SimpleNamespace(dump_dir=tmp_path / "dump", url="http://127.0.0.1:1")
    from pipeline.case import Case

    base = Case(tmp_path / "model", tmp_path / "data.jsonl", tmp_path / "bench-8", 8, 2032, format="speculators")
    sides = (("pipeline_drain_first_fp8", "fp8"), ("pipeline_drain_first_fp8_capture", "fp8"))
    for side, precision in (*sides, ("pipeline_drain_first", "bf16")):
        run = base.for_side(side, tmp_path / side)
        client = client_command(["hsx"], server, run)
        drain = drain_command(["hsx"], server, run.model, run.out, 0.01, None, run.format, run.precision)
        for cmd in (client, drain):
            assert cmd[cmd.index("--precision") + 1] == precision
            assert cmd[cmd.index("--format") + 1] == "speculators"


def test_a_case_with_the_fp8_side_gives_its_bytes_and_pace_beside_its_bf16_twin():
    import pipeline_gpu

    def run(tokens_per_s: float, gb: float) -> dict:
        return {
            "pipeline_tokens_per_s": tokens_per_s,
            "samples": 10,
            "tokens": 1000,
            "gb": gb,
            "pipeline_wall_s": 1.0,
            "drain_gb_per_s": gb,
            "tail_s": 0.5,
            "ok": True,
        }

    rows = {
        "plain_loop": [{"tokens_per_s": 1000.0, "samples": 10, "wall_s": 1.0}],
        "pipeline_drain_first": [run(800.0, 0.032), run(820.0, 0.032)],
        "pipeline_drain_first_fp8": [run(840.0, 0.016), run(860.0, 0.016)],
    }
    rows["pipeline_drain_first_fp8_capture"] = [run(900.0, 0.016)]
    rows["loop_on_capture"] = [{"tokens_per_s": 990.0, "ok": True}]
    rows["loop_on_capture_fp8"] = [{"tokens_per_s": 980.1, "ok": True}]
    res = pipeline_gpu.case_result(32, rows)
    assert (res["bf16_bytes_per_token"], res["fp8_bytes_per_token"], res["fp8_bytes_over_bf16"]) == (
        32_000.0,
        16_000.0,
        0.5,
    )
    assert res["fp8_whole_over_bf16"] == round(850 / 810, 4) and res["all_validated"]
    assert (res["fp8_capture_bytes_over_bf16"], res["fp8_capture_whole_over_bf16"]) == (0.5, round(900 / 810, 4))
    assert (res["capture_fp8_over_capture"], res["capture_fp8_over_plain"]) == (0.99, 0.9801)


def test_a_case_without_the_fp8_side_has_no_fp8_figures():
    import pipeline_gpu

    rows = {"plain_loop": [{"tokens_per_s": 1000.0, "samples": 10, "wall_s": 1.0}]}
    assert not any(k.startswith("fp8_") for k in pipeline_gpu.case_result(32, rows))


def test_a_loop_side_is_no_case_of_the_product(tmp_path):
    from pipeline.case import Case

    with pytest.raises(ValueError, match="plain_loop"):
        Case(tmp_path, tmp_path, tmp_path, 32, 2032).for_side("plain_loop", tmp_path / "out")


def test_a_client_alone_runs_without_a_staging_limit_and_the_others_with_the_clients_default(tmp_path):
    import pipeline_gpu
    from pipeline.processes import client_command

    server = types.SimpleNamespace(dump_dir=tmp_path / "dump", url="http://127.0.0.1:1")
    base = pipeline_gpu.Case(tmp_path / "model", tmp_path / "data.jsonl", tmp_path / "bench-8", 8, 2032)
    alone = client_command(["hsx"], server, base.for_side("client_alone", tmp_path / "a"))
    together = client_command(["hsx"], server, base.for_side("pipeline", tmp_path / "b"))
    assert alone[-2:] == ["--max-staged", "0"] and "--max-staged" not in together
    assert together[together.index("--max-in-flight") + 1] == "8"
    assert together[together.index("--format") + 1] == "specforge"


@pytest.mark.server
def test_the_tiers_selfcheck_compares_the_servers_own_logprobs_and_records_them(llama_server):
    ids = list(range(20, 44))
    rid = f"{llama_server.rid_prefix}-{secrets.token_hex(4)}-0"
    token = llama_server.generate(ids, rid=rid)["output_ids"][0]
    d = wait_done(llama_server.dump_dir, rid)
    try:
        verdict = capture_checks.selfcheck(
            llama_server.dump_dir, rid, llama_server.model_dir, ids, token, llama_server.url
        )
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert verdict["ok"] and verdict["exit_code"] == 0, verdict
    res = capture_checks.ConfigResult("cpu", "llama", [], False)
    capture_checks.record_logprobs(res, verdict)
    assert res.logprob_compared == 1 and res.summary()["logprob_worst_mean_abs_error"] < 0.01


@pytest.mark.server
def test_the_tiers_drain_asks_its_server_for_logprobs_and_its_result_records_the_numbers(
    llama_server, tiny_llama, tmp_path
):
    import pipeline_gpu

    dump, out = tmp_path / "dump", tmp_path / "out"
    capture(llama_server, dump, dump, load_or_create_run_id(out), list(range(3)), seed=81)
    finish_client(out, 3)
    server = types.SimpleNamespace(dump_dir=dump, url=llama_server.url)
    cmd = pipeline_gpu.drain_command([sys.executable, "-m", "hsextract"], server, tiny_llama, out, 1.0, None)
    done = subprocess.run(cmd, capture_output=True, text=True, env=hsextract_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    numbers = pipeline_gpu.selfcheck_numbers(out)
    assert numbers["logprob_done"] and numbers["logprob"]["compared"] == 3, numbers
    assert numbers["logprob"]["mean_abs_error_worst"] <= numbers["logprob"]["bound"]
