"""Bad capture configurations stop the server at start with a message that says what and how to fix."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from hsextract.capture.preflight import ServerFacts, check_dump_dir, check_server, check_sglang_version
from hsextract.errors import ConfigError
from sglang.srt.server_args import ServerArgs
from support.sglang_server import ServerStartError, start_server

pytestmark = pytest.mark.timeout(600)


def start_expecting_failure(model_dir, free_port, tmp_path, **kw) -> str:
    with pytest.raises(ServerStartError) as info:
        start_server(
            model_dir, port=free_port(), dump_dir=kw.pop("dump_dir", tmp_path / "dump"), log_dir=tmp_path / "logs", **kw
        )
    return str(info.value)


@pytest.mark.server
def test_one_failed_start_names_every_mistake_an_unknown_architecture_bad_layers_and_an_unwritable_dump_dir(
    tiny_llama, free_port, tmp_path
):
    """One start, three mistakes: the message names them all (the architecture and the supported
    ones, the layer range, the dump dir), with how to fix them, so one failed start is enough.
    (`hsextract capture-patch` refuses such layers already; this is the server's own check, for a
    patch rendered without the model at hand.)"""
    model = tmp_path / "model"
    shutil.copytree(tiny_llama, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["architectures"] = ["MistralForCausalLM"]  # SGLang serves it; the capture does not support it
    (model / "config.json").write_text(json.dumps(cfg))
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "--bind", "-o", "ro", str(ro), str(ro)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a read-only bind mount here")
    try:
        message = start_expecting_failure(
            model, free_port, tmp_path, dump_dir=ro / "dump", aux_layer_ids=[1, 3, 7], check_layers=False
        )
    finally:
        subprocess.run(["umount", str(ro)], check=False)
    assert "exited with code" in message
    assert "architecture 'MistralForCausalLM' is not supported by the hidden-state capture" in message
    assert "LlamaForCausalLM" in message and "KimiK25ForConditionalGeneration" in message
    assert "aux layer ids [1, 3, 7] (eagle convention) out of range for a model with 8 layers" in message
    assert "[7] not in [0, 6]" in message
    assert f"dump directory {ro / 'dump'} is not writable" in message
    assert "give the user that runs this process write access" in message


def facts(**kw) -> ServerFacts:
    """The facts the capture reads, from SGLang's real ServerArgs."""
    args = dict(model_path="unused", disable_radix_cache=True, device="cpu")
    args.update(kw)
    return ServerFacts.from_server_args(ServerArgs(**args))


def test_pipeline_parallel_is_refused():
    with pytest.raises(ConfigError, match=r"pipeline parallelism is on \(pp_size=2\).*use --pp-size 1"):
        check_server(facts(pp_size=2))


def test_radix_cache_is_refused():
    with pytest.raises(ConfigError, match=r"radix .*cache is on.*--disable-radix-cache"):
        check_server(facts(disable_radix_cache=False))


def test_prefill_cuda_graph_is_refused_on_gpu_unless_disabled():
    with pytest.raises(ConfigError, match=r"prefill CUDA graphs are on.*--disable-prefill-cuda-graph"):
        check_server(facts(device="cuda"))
    check_server(facts(device="cuda", disable_prefill_cuda_graph=True))
    check_server(facts(device="cuda", cuda_graph_backend_prefill="disabled"))


def test_capture_friendly_cpu_settings_pass():
    check_server(facts())


def test_dump_dir_check_creates_the_directory(tmp_path):
    assert check_dump_dir(tmp_path / "a" / "b").is_dir()


def test_an_untested_sglang_release_is_refused_with_the_tested_one_and_the_way_out():
    with pytest.raises(
        ConfigError,
        match=r"SGLang 0\.6\.0 is not a release the capture was tested on \(0\.5\.23\)"
        r".*sglang==0\.5\.23.*HSEXTRACT_ALLOW_UNTESTED_SGLANG=1",
    ):
        check_sglang_version("0.6.0", allow_untested=False)


def test_the_tested_sglang_release_and_an_explicit_opt_in_pass():
    check_sglang_version("0.5.23", allow_untested=False)
    check_sglang_version("0.6.0", allow_untested=True)
