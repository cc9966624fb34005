"""An output directory is resumed only from the dataset it was extracted from.

The client resumes by dataset index (it skips every index already in the training set), so an
output extracted from one dataset and resumed from another (the source dataset, then the
regenerated one) once finished "done" with the first dataset's replies under the second's
indices, without a word. The output now records its dataset; another dataset is refused before
anything is sent, the same one moved or grown at its end is resumed.

Each test starts from a copy of one output that a real ``hsextract extract`` and ``hsextract
drain`` made from a three-row dataset on the session's tiny Llama server.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hsextract.output.manifest import iter_entries
from support.client_run import env, extract_args

pytestmark = pytest.mark.server

RECORD = Path(".hsextract") / "dataset.json"


def _rows(tag: str, indices: range) -> str:
    return "".join(
        json.dumps(
            {
                "id": f"{tag}{i}",
                "messages": [
                    {"role": "user", "content": f"{tag} question {i}"},
                    {"role": "assistant", "content": f"{tag} answer {i}"},
                ],
            }
        )
        + "\n"
        for i in indices
    )


@dataclass
class Extracted:
    output: Path
    dataset: Path


def _extract(server, model: Path, dataset: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        extract_args(server.url, dataset, model, server.dump_dir, out, "--probe-timeout", "30"),
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _drain(server, out: Path) -> None:
    """Write what the client staged into the training set (and leave nothing of it in staging)."""
    d = subprocess.run(
        [
            sys.executable,
            "-m",
            "hsextract",
            "drain",
            "--dump-dir",
            str(server.dump_dir),
            "--output",
            str(out),
            "--format",
            "specforge",
            "--exit-when-done",
            "--poll-interval",
            "0.1",
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert d.returncode == 0, d.stderr[-3000:]


def _indices(out: Path) -> list[int]:
    return sorted(e.dataset_index for e in iter_entries(out))


def _summary(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# What a refused start does write: the lock it held while it checked, and its refusal in the status.
REFUSAL_BOOKKEEPING = (".hsextract/client-0-of-1.lock", ".hsextract/clients.lock", ".hsextract/client-status.json")


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and str(p.relative_to(root)) not in REFUSAL_BOOKKEEPING
    }


@pytest.fixture(scope="module")
def extracted(llama_server, tiny_llama, tmp_path_factory) -> Extracted:
    base = tmp_path_factory.mktemp("output-of-dataset-a")
    dataset = base / "a" / "data.jsonl"
    dataset.parent.mkdir()
    dataset.write_text(_rows("a", range(3)))
    out = base / "out"
    assert _summary(_extract(llama_server, tiny_llama, dataset, out))["ok"] == 3
    _drain(llama_server, out)
    assert _indices(out) == [0, 1, 2]
    return Extracted(out, dataset)


@pytest.fixture
def output(extracted, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(extracted.output, out)
    return out


def test_an_output_of_one_dataset_refuses_another_naming_both_and_changes_nothing(
    llama_server, tiny_llama, extracted, output, tmp_path
):
    other = tmp_path / "b" / "data.jsonl"  # as many rows: every index of it is "done" by index
    other.parent.mkdir()
    other.write_text(_rows("b", range(3)))
    before = _snapshot(output)
    r = _extract(llama_server, tiny_llama, other, output)
    assert r.returncode == 2, r.stderr[-3000:]
    assert f"output directory {output} was extracted from the dataset {extracted.dataset}" in r.stderr
    assert f"this run reads the dataset {other}, which is another dataset" in r.stderr
    assert "keep" in r.stderr and "samples under them" in r.stderr, "it says what resuming would do"
    assert "into a new --output" in r.stderr and f"or run with the original dataset {extracted.dataset}" in r.stderr
    assert _snapshot(output) == before, "the refusal changed the output directory"
    status = json.loads((output / ".hsextract" / "client-status.json").read_text())
    assert status["state"] == "done" and "which is another dataset" in status["start_refused"]["error"], status


def test_the_same_dataset_at_another_path_resumes_the_output(llama_server, tiny_llama, extracted, output, tmp_path):
    moved = tmp_path / "elsewhere" / "renamed.jsonl"
    moved.parent.mkdir()
    shutil.copyfile(extracted.dataset, moved)
    summary = _summary(_extract(llama_server, tiny_llama, moved, output))
    assert (summary["state"], summary["skipped"], summary["ok"]) == ("done", 3, 0)
    assert json.loads((output / RECORD).read_text())["path"] == str(moved), "the record follows the dataset"
    assert _indices(output) == [0, 1, 2]


def test_a_dataset_grown_at_its_end_resumes_and_extracts_only_the_new_rows(
    llama_server, tiny_llama, extracted, output, tmp_path
):
    grown = tmp_path / "data.jsonl"
    grown.write_text(extracted.dataset.read_text() + _rows("a", range(3, 4)))
    summary = _summary(_extract(llama_server, tiny_llama, grown, output))
    assert (summary["state"], summary["skipped"], summary["ok"]) == ("done", 3, 1)
    _drain(llama_server, output)
    assert _indices(output) == [0, 1, 2, 3]


def test_an_output_without_a_record_from_an_older_hsextract_is_resumed_and_gets_one(
    llama_server, tiny_llama, extracted, output
):
    (output / RECORD).unlink()  # what an hsextract before the record left
    r = _extract(llama_server, tiny_llama, extracted.dataset, output)
    summary = _summary(r)
    assert (summary["state"], summary["skipped"], summary["ok"]) == ("done", 3, 0)
    assert "has a training set but no record of its dataset (an older hsextract made it)" in r.stderr
    assert json.loads((output / RECORD).read_text())["path"] == str(extracted.dataset)
    other = extracted.dataset.parent / "other.jsonl"
    other.write_text(_rows("b", range(3)))
    refused = _extract(llama_server, tiny_llama, other, output)
    assert refused.returncode == 2 and "which is another dataset" in refused.stderr, "the new record guards it"
