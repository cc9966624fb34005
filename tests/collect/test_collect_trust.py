"""A host output is not trusted: collect reads, links and removes only regular files inside it, and
collects a row only when its file is that row's sample.

A broken or compromised GPU host controls its manifest rows and every file rsync brings from it.
Whatever it names (a path out of its output, an absolute path, a symbolic link, a FIFO, another
sample's file with that file's size and checksum), collect refuses that row or that host by name,
never reads, copies or removes a file of the collector, and collects every other sample."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hsextract.output.manifest import checksum_file, iter_entries
from support.drain_proc import hsextract
from support.fleet import Fleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
SECRET = b"a file of the collector that no host may read\n"


def _rows(host: Path) -> list[dict]:
    return [json.loads(line) for line in (host / "manifest.jsonl").read_text().splitlines()]


def _write_rows(host: Path, rows: list[dict]) -> None:
    (host / "manifest.jsonl").write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))


def _name_file(host: Path, k: int, file: str, target: Path) -> dict:
    """Row k of `host` now names `file`, with the size and checksum of `target` (what it points at)."""
    rows = _rows(host)
    algorithm = rows[k]["checksum"].split(":", 1)[0]
    rows[k].update(file=file, bytes=target.stat().st_size, checksum=checksum_file(target, algorithm))
    _write_rows(host, rows)
    return rows[k]


def _secret(tmp_path: Path) -> Path:
    path = tmp_path / "victim" / "secret.txt"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def _failures(into: Path) -> list[dict]:
    path = into / ".hsextract" / "collect-failures.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _nothing_of(into: Path, secret: bytes) -> None:
    """No file of the collected set is a link, or holds the collector's secret."""
    for dirpath, dirs, names in os.walk(into):
        for name in names + dirs:
            p = Path(dirpath) / name
            assert not p.is_symlink(), f"{p} is a symbolic link"
            if p.is_file():
                assert secret not in p.read_bytes(), f"{p} holds the collector's file"


def _collected(into: Path) -> set[int]:
    return {e.dataset_index for e in iter_entries(into)}


def _copy(fleets, tmp_path: Path, fmt: str = "speculators") -> Fleet:
    return fleets(fmt).copy(tmp_path / "hosts")


# -- D16: paths a row names --------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_a_row_naming_a_file_outside_its_host_is_refused_and_move_leaves_that_file(how, fleets, collect, tmp_path):
    fleet = _copy(fleets, tmp_path)
    secret = _secret(tmp_path)
    name = os.path.relpath(secret, fleet.hosts["a"]) if how == "dotdot" else str(secret)
    row = _name_file(fleet.hosts["a"], 1, name, secret)
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), "--move", *fleet.args())
    assert code == 3, err
    assert secret.read_bytes() == SECRET, "the collector's file is still there"
    [failure] = _failures(into)
    assert (failure["host"], failure["host_index"], failure["reason"]) == ("a", 1, "collect_unsafe_path")
    assert f"{len(SECRET)} bytes" not in failure["detail"] and row["checksum"].split(":")[1] not in failure["detail"]
    assert f"FAILED a sample 1 (dataset index {row['dataset_index']}): collect_unsafe_path: " in err
    assert row["dataset_index"] not in _collected(into)
    assert _collected(into) == set(fleet.samples) - {row["dataset_index"]}, "every other sample is collected"
    _nothing_of(into, SECRET)


@pytest.mark.parametrize("mode", ["copy", "link", "move"])
def test_a_sample_file_that_is_a_symbolic_link_is_refused_in_every_mode(mode, fleets, collect, tmp_path):
    fleet = _copy(fleets, tmp_path)
    secret = _secret(tmp_path)
    rows = _rows(fleet.hosts["a"])
    sample = fleet.hosts["a"] / rows[2]["file"]
    sample.unlink()
    sample.symlink_to(secret)
    _name_file(fleet.hosts["a"], 2, rows[2]["file"], secret)
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), *([] if mode == "copy" else [f"--{mode}"]), *fleet.args())
    assert code == 3, err
    [failure] = _failures(into)
    assert (failure["host"], failure["host_index"], failure["reason"]) == ("a", 2, "collect_unsafe_path")
    assert "symbolic link" in failure["detail"]
    assert secret.read_bytes() == SECRET and sample.is_symlink()
    _nothing_of(into, SECRET)


def test_a_sample_directory_that_is_a_symbolic_link_is_not_followed(fleets, collect, tmp_path):
    fleet = _copy(fleets, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(fleet.hosts["a"] / "hidden_states", elsewhere)
    (fleet.hosts["a"] / "hidden_states").symlink_to(elsewhere)
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), "--move", *fleet.args())
    assert code == 3, err
    refused = _failures(into)
    assert {(d["host"], d["reason"]) for d in refused} == {("a", "collect_unsafe_path")}
    assert len(refused) == len([x for x in fleet.samples if x % 3 == 0])
    assert "hidden_states is a symbolic link" in refused[0]["detail"]
    assert len(list(elsewhere.iterdir())) == len(refused), "nothing was moved out of the linked directory"


def test_a_sample_file_that_is_a_fifo_is_refused_without_waiting_on_it(fleets, collect, tmp_path):
    fleet = _copy(fleets, tmp_path)
    row = _rows(fleet.hosts["b"])[0]
    (fleet.hosts["b"] / row["file"]).unlink()
    os.mkfifo(fleet.hosts["b"] / row["file"])
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args())
    assert code == 3, err
    [failure] = _failures(into)
    assert (failure["host"], failure["host_index"], failure["reason"]) == ("b", 0, "collect_unsafe_path")
    assert "a FIFO, not a regular file" in failure["detail"]


# -- D16: the host's own bookkeeping and quarantine ---------------------------------------------------


def _link_reason(host: Path, secret: Path) -> str:
    d = host / "quarantine" / "hsx-abcdef0123456789-2"
    d.mkdir(parents=True)
    (d / "reason.txt").symlink_to(secret)
    (d / "source.json").symlink_to("/etc/hostname")
    return "quarantine/hsx-abcdef0123456789-2/reason.txt is a symbolic link"


def _fifo_record(host: Path, secret: Path) -> str:
    d = next((host / "quarantine").iterdir())
    (d / "record.json").unlink(missing_ok=True)
    os.mkfifo(d / "record.json")
    return f"quarantine/{d.name}/record.json is a FIFO"


def _linked_quarantine(host: Path, secret: Path) -> str:
    shutil.rmtree(host / "quarantine")
    (secret.parent / "hsx-abcdef0123456789-2").mkdir()
    (secret.parent / "hsx-abcdef0123456789-2" / "reason.txt").write_bytes(SECRET)
    (host / "quarantine").symlink_to(secret.parent)
    return "quarantine is a symbolic link"


def _linked_rejects(host: Path, secret: Path) -> str:
    secret.write_text(json.dumps({"index": 0, "reason": SECRET.decode()}) + "\n")
    (host / ".hsextract" / "rejects.jsonl").unlink(missing_ok=True)
    (host / ".hsextract" / "rejects.jsonl").symlink_to(secret)
    return ".hsextract/rejects.jsonl is a symbolic link"


@pytest.mark.parametrize(
    "plant",
    [_link_reason, _fifo_record, _linked_quarantine, _linked_rejects],
    ids=["linked-reason", "fifo-record", "linked-quarantine", "linked-rejects"],
)
def test_a_host_whose_bookkeeping_holds_a_link_or_a_special_file_is_refused_by_name(plant, fleets, collect, tmp_path):
    fleet = _copy(fleets, tmp_path)
    secret = _secret(tmp_path)
    what = plant(fleet.hosts["c"], secret)
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args())
    assert code == 3, err
    line = next(x for x in err.splitlines() if x.startswith("host c "))
    assert what in line and "nothing of it was collected" in line
    assert _collected(into) == {x for x in fleet.samples if x % 3 != 2}
    _nothing_of(into, SECRET)
    assert all(json.loads(p.read_text())["host"] != "c" for p in (into / "quarantine").glob("*/host.json"))


def test_the_playbooks_rsync_brings_no_link_and_no_special_file_from_a_host(tmp_path):
    settings = yaml.safe_load((REPO / "playbooks" / "vars" / "collect.yml").read_text())
    argv = settings["collect_rsync"]
    options = argv[: argv.index("-e")]  # the rest is the SSH command, a template
    host = tmp_path / "host"
    (host / "quarantine" / "q").mkdir(parents=True)
    (host / "manifest.json").write_text("{}")
    (host / "quarantine" / "q" / "reason.txt").symlink_to("/etc/hostname")
    (host / "quarantine" / "q" / "inside.txt").symlink_to("../../manifest.json")
    os.mkfifo(host / "quarantine" / "q" / "record.json")
    staged = tmp_path / "staged"
    r = subprocess.run([*options, f"{host}/", f"{staged}/"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (staged / "manifest.json").is_file()
    assert sorted(p.name for p in (staged / "quarantine" / "q").iterdir()) == []


# -- D24: a row and its file -------------------------------------------------------------------------


def _pair(host: Path, same_length: bool) -> tuple[int, int]:
    """Two rows of `host` whose samples have the same token count, or different ones."""
    rows = _rows(host)
    return next(
        (j, k)
        for j in range(len(rows))
        for k in range(j + 1, len(rows))
        if (rows[j]["tokens"] == rows[k]["tokens"]) == same_length
    )


def _swap_files(host: Path, j: int, k: int) -> tuple[dict, dict]:
    """Rows j and k of `host` keep their names, but each file now holds the other's sample, and each
    row the other file's size and checksum: every file matches its row's size and checksum."""
    rows = _rows(host)
    a, b = host / rows[j]["file"], host / rows[k]["file"]
    tmp = a.with_suffix(".swap")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)
    for key in ("bytes", "checksum"):
        rows[j][key], rows[k][key] = rows[k][key], rows[j][key]
    _write_rows(host, rows)
    return rows[j], rows[k]


def test_a_row_naming_another_samples_file_is_refused_naming_host_and_row(fleets, collect, tmp_path):
    fleet = _copy(fleets, tmp_path)
    rows = _rows(fleet.hosts["a"])
    rows[1].update(file=rows[2]["file"], bytes=rows[2]["bytes"], checksum=rows[2]["checksum"])
    _write_rows(fleet.hosts["a"], rows)
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args())
    assert code == 3, err
    [failure] = _failures(into)
    assert (failure["host"], failure["host_index"], failure["reason"]) == ("a", 1, "collect_wrong_sample")
    assert "hidden_states/hs_2.safetensors" in failure["detail"] and "hs_1.safetensors" in failure["detail"]
    assert f"FAILED a sample 1 (dataset index {rows[1]['dataset_index']}): collect_wrong_sample: " in err
    assert _collected(into) == set(fleet.samples) - {rows[1]["dataset_index"]}


@pytest.mark.parametrize("fmt", ["specforge", "speculators", "speculators-v1", "modelopt"])
def test_a_file_holding_another_sample_of_another_length_is_refused_by_its_token_count(fmt, fleets, collect, tmp_path):
    fleet = _copy(fleets, tmp_path, fmt)
    first, second = _pair(fleet.hosts["a"], same_length=False)
    j, k = _swap_files(fleet.hosts["a"], first, second)
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args())
    assert code == 3, err
    failures = {d["host_index"]: d for d in _failures(into)}
    assert sorted(failures) == [first, second]
    assert {d["reason"] for d in failures.values()} == {"collect_wrong_sample"}
    assert f"{k['tokens']} tokens, the row says {j['tokens']}" in failures[first]["detail"]
    assert _collected(into) == set(fleet.samples) - {j["dataset_index"], k["dataset_index"]}


@pytest.mark.parametrize("fmt", ["specforge", "speculators", "speculators-v1", "modelopt"])
def test_a_file_holding_another_sample_of_the_same_length_is_refused(fmt, fleets, collect, tmp_path):
    fleet = _copy(fleets, tmp_path, fmt)
    entries = list(iter_entries(fleet.hosts["a"]))
    first, second = _pair(fleet.hosts["a"], same_length=True)  # dataset indices x and x + 9: as many tokens each
    j, k = entries[first], entries[second]
    _swap_files(fleet.hosts["a"], first, second)
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args())
    assert code == 3, err
    failures = {d["host_index"]: d for d in _failures(into)}
    assert sorted(failures) == [j.output_index, k.output_index]
    assert {d["reason"] for d in failures.values()} == {"collect_wrong_sample"}
    said = failures[j.output_index]["detail"]
    assert "fingerprint" in said or f"dataset index {k.dataset_index}" in said
    assert _collected(into) == set(fleet.samples) - {j.dataset_index, k.dataset_index}


def test_every_sample_of_a_genuine_host_passes_the_sample_checks(fleets, collect, tmp_path):
    fleet, into = fleets("speculators"), tmp_path / "collected"
    code, err = collect("--into", str(into), *fleet.args())
    assert code == 0, err
    assert _failures(into) == []
    assert all(e.fingerprint.startswith("fp") for e in iter_entries(into)), "the fingerprints were there to check"


# -- D35: a consistent lie ---------------------------------------------------------------------------


def test_a_consistent_lie_in_a_host_manifest_fails_both_rows_and_verify_flags_them(fleets, collect, tmp_path):
    """Row 1's file replaced by a byte copy of row 2's, row 1 given row 2's size, checksum, token count
    and fingerprint: every check of the row against its file passes, and only the two rows' one
    checksum tells. Nothing says which row is true, so neither is collected."""
    fleet = _copy(fleets, tmp_path)
    host = fleet.hosts["a"]
    rows = _rows(host)
    shutil.copy(host / rows[2]["file"], host / rows[1]["file"])
    for key in ("bytes", "checksum", "tokens", "fingerprint"):
        rows[1][key] = rows[2][key]
    _write_rows(host, rows)
    verify = hsextract("finalize", "--output", str(host), "--verify")
    assert verify.returncode == 1
    assert "BAD 1 (" in verify.stdout and "BAD 2 (" in verify.stdout and "same bytes" in verify.stdout, verify.stdout
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), "--final", *fleet.args())
    assert code == 3, err
    failures = {d["host_index"]: d for d in _failures(into)}
    assert sorted(failures) == [1, 2] and {d["reason"] for d in failures.values()} == {"collect_same_bytes"}
    assert "host a sample 2" in failures[1]["detail"] and "host a sample 1" in failures[2]["detail"]
    assert _collected(into) == set(fleet.samples) - {rows[1]["dataset_index"], rows[2]["dataset_index"]}
    assert "PROBLEM" not in err, "the fleet's accounts add up: the two rows are failed samples"
    assert hsextract("finalize", "--output", str(into), "--verify").returncode == 0
