"""``hsextract finalize --verify`` checks that each row's file is the row's sample, not only that it
has the row's size and checksum: its name is the row's, its tensors hold the row's token count, and
its rows give the fingerprint the row recorded. It reads only regular files inside the set.

The training set is written by the real drain (support.fleet: staged without a server)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hsextract.cli import main
from hsextract.output.manifest import checksum_file, iter_entries
from hsextract.shard import Shard
from support.fleet import HostPlan, make_fleet

FORMATS = ["specforge", "speculators", "speculators-v1", "modelopt"]
LINES = 12
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """sets(fmt): a drained training set of a 12-line dataset, built once per format."""
    built: dict[str, Path] = {}

    def get(fmt: str) -> Path:
        if fmt not in built:
            fleet = make_fleet(tmp_path_factory.mktemp(f"set-{fmt}"), fmt, [HostPlan("a", Shard(0, 1))], LINES)
            built[fmt] = fleet.hosts["a"]
        return built[fmt]

    return get


@pytest.fixture
def verify(capsys):
    """verify(out) -> (exit status, stdout) of ``hsextract finalize --output out --verify``."""

    def run(out: Path) -> tuple[int, str]:
        capsys.readouterr()
        code = main(["finalize", "--output", str(out), "--verify", "--draft-vocab-size", "16", "64"])
        return code, capsys.readouterr().out

    return run


def _copy(sets, fmt: str, tmp_path: Path) -> Path:
    import shutil

    out = tmp_path / "set"
    shutil.copytree(sets(fmt), out, symlinks=True)
    return out


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def _write_rows(out: Path, rows: list[dict]) -> None:
    (out / "manifest.jsonl").write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))


def _pair(out: Path, same_length: bool) -> tuple[int, int]:
    """Two rows whose samples have the same token count, or different ones."""
    rows = _rows(out)
    return next(
        (j, k)
        for j in range(len(rows))
        for k in range(j + 1, len(rows))
        if (rows[j]["tokens"] == rows[k]["tokens"]) == same_length
    )


def _swap_files(out: Path, j: int, k: int) -> None:
    """Files j and k trade places, and rows j and k their sizes and checksums: each file matches its row's."""
    rows = _rows(out)
    a, b = out / rows[j]["file"], out / rows[k]["file"]
    tmp = a.with_name("swap.tmp")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)
    for key in ("bytes", "checksum"):
        rows[j][key], rows[k][key] = rows[k][key], rows[j][key]
    _write_rows(out, rows)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_genuine_set_verifies(fmt, sets, verify):
    code, out = verify(sets(fmt))
    assert code == 0, out
    assert f"verified {LINES}/{LINES} samples" in out


def test_a_row_naming_another_samples_file_is_bad(sets, verify, tmp_path):
    out = _copy(sets, "speculators", tmp_path)
    rows = _rows(out)
    rows[5].update(file=rows[6]["file"], bytes=rows[6]["bytes"], checksum=rows[6]["checksum"])
    _write_rows(out, rows)
    code, said = verify(out)
    assert code == 1
    assert f"BAD 5 ({rows[5]['rid']}): " in said and "hidden_states/hs_6.safetensors" in said
    assert f"verified {LINES - 1}/{LINES} samples" in said


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_file_holding_a_sample_of_another_length_is_bad_by_its_token_count(fmt, sets, verify, tmp_path):
    out = _copy(sets, fmt, tmp_path)
    rows = _rows(out)
    j, k = _pair(out, same_length=False)
    _swap_files(out, j, k)
    code, said = verify(out)
    assert code == 1
    assert f"BAD {j} ({rows[j]['rid']}): " in said
    assert f"{rows[k]['tokens']} tokens, the row says {rows[j]['tokens']}" in said
    assert f"BAD {k} ({rows[k]['rid']}): " in said


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_file_holding_another_sample_of_the_same_length_is_bad(fmt, sets, verify, tmp_path):
    out = _copy(sets, fmt, tmp_path)
    entries = list(iter_entries(out))
    j, k = _pair(out, same_length=True)  # dataset indices x and x + 9: as many tokens each
    _swap_files(out, j, k)
    code, said = verify(out)
    assert code == 1
    bad = next(line for line in said.splitlines() if line.startswith(f"BAD {j} ({entries[j].rid}): "))
    assert "fingerprint" in bad or f"dataset index {entries[k].dataset_index}" in bad
    assert f"verified {LINES - 2}/{LINES} samples" in said


def test_a_sample_file_that_is_a_symbolic_link_is_bad_and_not_read(sets, verify, tmp_path):
    out = _copy(sets, "speculators", tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("not a sample\n")
    rows = _rows(out)
    (out / rows[3]["file"]).unlink()
    (out / rows[3]["file"]).symlink_to(secret)
    rows[3].update(bytes=secret.stat().st_size, checksum=checksum_file(secret, rows[3]["checksum"].split(":")[0]))
    _write_rows(out, rows)
    code, said = verify(out)
    assert code == 1
    assert f"BAD 3 ({rows[3]['rid']}): " in said and "is a symbolic link" in said
