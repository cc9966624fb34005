"""The formats have one registry (hsextract.formats.FORMATS): every CLI's --format choices, the
drain's writers and the roles' argument specs name the same formats, with the same final-norm
placement."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml
from hsextract.formats import (
    DEFAULT_FORMAT,
    DEFAULT_PRECISION,
    FINAL_HIDDEN_PLACEMENTS,
    FORMAT_NAMES,
    FORMATS,
    PRECISIONS,
    get_format,
)

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "hsextract"


def _options() -> dict:
    return yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]


def test_the_roles_format_choices_are_the_registrys_names():
    assert _options()["hsextract_format"]["choices"] == list(FORMAT_NAMES)


def test_the_roles_precision_choices_and_default_are_the_registrys():
    assert _options()["hsextract_precision"]["choices"] == list(PRECISIONS)
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["hsextract_precision"] == DEFAULT_PRECISION


def test_the_roles_final_hidden_choices_are_the_registrys_placements():
    assert _options()["hsextract_final_hidden"]["choices"] == list(FINAL_HIDDEN_PLACEMENTS)


def test_the_roles_default_final_hidden_follows_the_registry():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    expr = defaults["hsextract_final_hidden"]
    m = re.fullmatch(r"\{\{ 'post_norm' if hsextract_format in \[([^\]]*)\] else 'pre_norm' \}\}", expr)
    assert m, f"hsextract_final_hidden is no longer the expression this test reads: {expr}"
    post_norm = {s.strip().strip("'\"") for s in m[1].split(",")}
    assert post_norm == {n for n, s in FORMATS.items() if s.final_hidden == "post_norm"}
    assert defaults["hsextract_format"] == DEFAULT_FORMAT


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_each_registered_writer_is_the_format_it_is_registered_as(name):
    spec = FORMATS[name]
    assert spec.final_hidden in FINAL_HIDDEN_PLACEMENTS
    assert get_format(name).name == name


@pytest.mark.parametrize(
    "module",
    ["hsextract.client.command", "hsextract.drain.command", "hsextract.capture.patch", "hsextract.plan.command"],
)
def test_every_cli_offers_the_registrys_formats(module):
    import importlib

    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    action = next(a for a in parser._actions if "--format" in a.option_strings)
    assert tuple(action.choices) == FORMAT_NAMES


@pytest.mark.parametrize("module", ["hsextract.client.command", "hsextract.drain.command", "hsextract.plan.command"])
def test_every_cli_that_takes_a_format_offers_the_registrys_precisions(module):
    import importlib

    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    action = next(a for a in parser._actions if "--precision" in a.option_strings)
    assert tuple(action.choices) == PRECISIONS and action.default in (DEFAULT_PRECISION, None)


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_each_entry_states_the_precisions_its_trainers_released_reader_reads(name):
    spec = FORMATS[name]
    assert "bf16" in spec.precisions and set(spec.precisions) <= set(PRECISIONS)
    assert bool(spec.fp8_loading) == ("fp8" in spec.precisions), "how its trainer is told a set holds FP8 rows"


def test_only_the_speculators_reader_reads_fp8_rows():
    """hs_connectors 0.9's FP8Transfer (tests/formats/test_fp8_readers.py); SpecForge 0.2, speculators
    0.7's v1 reader and ModelOpt 0.47 read the rows as stored, so FP8 bytes would be misread."""
    assert {n for n, s in FORMATS.items() if "fp8" in s.precisions} == {"speculators"}


@pytest.mark.parametrize(
    ("fmt", "trainer"), [("specforge", "SpecForge"), ("speculators-v1", "speculators 0.7"), ("modelopt", "ModelOpt")]
)
def test_fp8_is_refused_for_a_format_whose_reader_reads_bf16_rows_only(fmt, trainer):
    from hsextract.errors import ConfigError
    from hsextract.formats import check_precision

    check_precision("speculators", "fp8")
    check_precision(fmt, "bf16")
    with pytest.raises(ConfigError) as err:
        check_precision(fmt, "fp8")
    assert str(err.value).startswith(f"precision fp8: the {fmt} format's reader ({trainer}")
    assert "reads bf16 rows only; fp8 is read by: speculators" in str(err.value), err.value
    assert str(err.value).endswith(f"`hsextract collect --to-bf16 --format {fmt}`)"), "and the way to its files"


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_each_entry_holds_every_fact_the_rest_of_hsextract_reads_of_its_format(name):
    from hsextract.staging.dumps import DTYPE_BYTES
    from hsextract.vocab.files import VOCAB_KINDS

    spec = FORMATS[name]
    assert spec.dtypes and set(spec.dtypes) <= set(DTYPE_BYTES), "the dtypes its files hold"
    assert "<set>" in spec.loading and spec.trainer.split()[0] in spec.loading, "how its trainer loads a set"
    assert spec.vocab_files, "its trainer's draft-vocabulary files"
    assert {f.kind for f in spec.vocab_files} <= set(VOCAB_KINDS)
    assert all("{size}" in f.name for f in spec.vocab_files), "each size's file and the first size's link"
    sized = spec.dataset_bytes_per_sample > 0 or spec.dataset_bytes_per_token > 0
    assert sized == bool(spec.dataset_files), "the plan sizes the dataset-level files it has, and only those"


def test_the_drain_refuses_a_model_whose_dtype_the_format_does_not_hold():
    from hsextract.errors import ConfigError
    from hsextract.formats import check_dtype

    check_dtype("speculators", "bfloat16", where="the model /m")
    with pytest.raises(ConfigError, match=r"the model /m has float8_e4m3fn states, which the format 'modelopt'"):
        check_dtype("modelopt", "float8_e4m3fn", where="the model /m")
