"""The ``pyrepr`` filter renders the capture patch's config as a Python literal, as `hsextract capture-patch` does."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_filter():
    spec = importlib.util.spec_from_file_location("hsx_pyrepr", REPO / "filter_plugins" / "pyrepr.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()["pyrepr"]


def test_a_capture_config_round_trips_through_python_literal_syntax():
    config = {"architecture": "LlamaForCausalLM", "aux_layer_ids": None, "writer_threads": 0,
              "final_hidden": "pre_norm", "extra": {}, "layers": [1, 3, 4], "flag": True}
    assert ast.literal_eval(load_filter()(config)) == config


def test_it_matches_the_cli_renderer_for_plain_values():
    config = {"model_path": "/models/x", "aux_layer_ids": [1, 29, 57]}
    assert load_filter()(config) == repr(config)
