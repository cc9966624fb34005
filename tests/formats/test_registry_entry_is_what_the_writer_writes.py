"""A format's registry entry (hsextract.formats.FORMATS) says what the rest of hsextract may count on
without importing its writer: the dataset-level files its finalize writes, and its trainer's draft
vocabulary files. A drained set of every format holds exactly those."""

from __future__ import annotations

from pathlib import Path

import pytest
from hsextract.drain.core import DrainConfig, Drainer
from hsextract.formats import FORMAT_NAMES, FORMATS, get_format
from hsextract.output.manifest import iter_entries, read_header
from hsextract.output.run_id import load_or_create_run_id
from hsextract.vocab.files import torch_suffix
from support.drain_proc import finish_client
from support.staged_dumps import stage_sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module", params=FORMAT_NAMES)
def drained(request, tmp_path_factory) -> tuple[str, Path]:
    fmt = request.param
    dump, out = tmp_path_factory.mktemp(fmt) / "dump", tmp_path_factory.mktemp(fmt) / "out"
    run = load_or_create_run_id(out)
    for i in range(3):
        stage_sample(dump, run, i, tokens=6 + i, final_hidden=FORMATS[fmt].final_hidden)
    finish_client(out, 3)
    config = DrainConfig(
        dump_dir=dump,
        output=out,
        format=fmt,
        workers=1,
        poll_interval_s=0.05,
        exit_when_done=True,
        vocab_size=1000,
        draft_vocab_sizes=(16,),
    )
    assert Drainer(config).run() == 0
    return fmt, out


def test_the_dataset_level_files_are_those_the_registry_names(drained):
    fmt, out = drained
    written = get_format(fmt).finalize(out, read_header(out), list(iter_entries(out)))
    assert sorted(str(p.relative_to(out)) for p in written) == sorted(FORMATS[fmt].dataset_files)


def test_the_draft_vocabulary_files_are_those_the_registry_names(drained):
    fmt, out = drained
    pt = torch_suffix(get_format(fmt).reads_every_pt_file)
    for f in FORMATS[fmt].vocab_files:
        for size in ("-16", ""):
            assert (out / f.name.format(size=size, pt=pt)).is_file(), f.name
