"""``hsextract plan`` predicts what a real extract of the same dataset sends and writes.

The dataset is the client tests' mixed one (ShareGPT, OpenAI and pre-tokenized lines plus one line
of each kind of bad input, whose truth is known line by line). The real client sends it to the
session's real server; its dumps are drained into every format; plan's samples, rejects, tokens
and loss-masked tokens must equal what was sent, and its bytes per format the manifest's.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hsextract.cli import main
from hsextract.dataset.chat_template import load_tokenizer
from hsextract.formats import FORMAT_NAMES, FORMATS
from hsextract.output.manifest import ManifestAppender, ManifestEntry, iter_entries
from hsextract.output.run_id import load_or_create_run_id
from hsextract.plan.report import bytes_key
from hsextract.staging.dumps import iter_complete
from hsextract.staging.records import parse_rid
from support.client_run import env, extract_args, start_client, stop, tail, wait_exit, wait_for, write_mixed_dataset
from support.drain_proc import hsextract

pytestmark = pytest.mark.slow

LIMITS = ("--max-tokens", "300", "--overlong", "skip")


def plan(dataset: Path, model: Path, report: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`hsextract plan`'s exit status, output and report. It runs through the CLI's own `main` in this
    process, which has the tokenizer's libraries imported already (a process of its own spends about
    2 CPU-seconds importing them, and this module plans two dozen times); a plan with several
    tokenizing processes runs as a process of its own, as the command does."""
    argv = [
        "plan",
        "--dataset",
        str(dataset),
        "--model",
        str(model),
        "--json",
        str(report),
        "--no-progress",
        *LIMITS,
        *extra,
    ]
    workers = int(extra[extra.index("--workers") + 1]) if "--workers" in extra else 1
    if workers > 1:
        r = subprocess.run(
            [sys.executable, "-m", "hsextract", *argv], env=env(), capture_output=True, text=True, timeout=600
        )
    else:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
        r = subprocess.CompletedProcess(argv, rc, out.getvalue(), err.getvalue())
    data = json.loads(report.read_text()) if report.exists() else {}
    return r, data


@pytest.mark.server
@pytest.mark.timeout(900)
def test_plan_equals_what_a_real_extract_sends_and_writes_in_every_format(llama_server, tiny_llama, tmp_path):
    exp = write_mixed_dataset(tmp_path / "data.jsonl", load_tokenizer(tiny_llama), n_lines=80, seed=4)
    out, logs = tmp_path / "client-out", tmp_path / "logs"
    logs.mkdir()
    run_id = load_or_create_run_id(out)
    client = start_client(
        logs / "client.log",
        *extract_args(
            llama_server.url,
            tmp_path / "data.jsonl",
            tiny_llama,
            llama_server.dump_dir,
            out,
            *LIMITS,
            "--max-in-flight",
            "4",
        ),
    )
    try:
        assert wait_exit(client, 420, logs / "client.log") == 0, tail(logs / "client.log")
    finally:
        stop(client)
    summary = json.loads((out / ".hsextract" / "client-summary.json").read_text())

    def ours() -> list[Path]:
        return [d for d in iter_complete(llama_server.dump_dir) if (p := parse_rid(d.name)) and p.run_id == run_id]

    wait_for(lambda: len(ours()) == summary["ok"], 60, "every answered sample's dump")
    staged = tmp_path / "staged"
    (staged / "_records").mkdir(parents=True)
    for d in ours():
        shutil.move(str(d), staged / d.name)
        shutil.move(str(llama_server.dump_dir / "_records" / f"{d.name}.json"), staged / "_records")

    written: dict[str, list] = {}
    for fmt, precision in ((n, p) for n in FORMAT_NAMES for p in FORMATS[n].precisions):
        key = bytes_key(fmt, precision)
        dump, fout = tmp_path / f"dump-{key.replace(' ', '-')}", tmp_path / f"out-{key.replace(' ', '-')}"
        shutil.copytree(staged, dump)
        fout.mkdir()
        shutil.copy(out / "run.json", fout / "run.json")
        shutil.copytree(out / ".hsextract", fout / ".hsextract")  # the client's summary, rejects and failures
        if FORMATS[fmt].final_hidden == "pre_norm":  # the sizes do not depend on where the norm is
            for marker in dump.glob("*/done.json"):
                marker.write_text(marker.read_text().replace('"post_norm"', '"pre_norm"'))
        for record in (dump / "_records").glob("*.json"):  # the client's records, as if it ran for this drain
            data = json.loads(record.read_text())
            record.write_text(json.dumps({**data, "format": fmt, "output": str(fout)}))
        r = hsextract(
            "drain",
            "--dump-dir",
            str(dump),
            "--output",
            str(fout),
            "--format",
            fmt,
            "--model",
            str(tiny_llama),
            "--precision",
            precision,
            "--exit-when-done",
            "--poll-interval",
            "0.1",
        )
        assert r.returncode == 0, f"{key} drain exited {r.returncode}:\n{r.stderr[-3000:]}"
        written[key] = list(iter_entries(fout))
    masked = json.loads((tmp_path / "out-specforge" / "draft_vocab.json").read_text())["masked_tokens"]

    r, report = plan(tmp_path / "data.jsonl", tiny_llama, tmp_path / "plan.json", "--workers", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    entries = written["specforge"]
    assert report["samples"] == summary["ok"] == len(entries) == len(exp.samples)
    assert report["rejects"] == summary["rejected"]
    assert report["tokens"] == summary["tokens"] == sum(e.tokens for e in entries)
    assert report["loss_masked_tokens"] == masked == sum(sum(m) for _, m in exp.samples.values())
    assert report["length_percentiles"]["max"] == max(e.tokens for e in entries)
    assert report["overlong"]["skipped"] == 1 and report["overlong"]["samples"] == 1
    assert list(report["formats"]) == list(written)  # every format, and FP8 where its reader reads it
    for key, entries in written.items():
        assert report["formats"][key]["sample_bytes"] == sum(e.bytes for e in entries), key
    assert "samples" in r.stdout and "speculators" in r.stdout


def _dataset(tmp_path: Path, tiny_llama: Path, n: int = 60) -> tuple[Path, object]:
    exp = write_mixed_dataset(tmp_path / "data.jsonl", load_tokenizer(tiny_llama), n_lines=n, seed=2)
    return tmp_path / "data.jsonl", exp


def test_fp8_for_a_format_whose_reader_reads_bf16_only_is_refused_before_the_scan(tiny_llama, tmp_path):
    data, _ = _dataset(tmp_path, tiny_llama, n=4)
    r, report = plan(data, tiny_llama, tmp_path / "plan.json", "--format", "modelopt", "--precision", "fp8")
    assert r.returncode != 0 and report == {}
    assert "precision fp8: the modelopt format's reader (ModelOpt) reads bf16 rows only" in r.stderr, r.stderr


def test_plan_in_several_processes_equals_plan_in_one(tiny_llama, tmp_path):
    data, exp = _dataset(tmp_path, tiny_llama)
    r1, one = plan(data, tiny_llama, tmp_path / "one.json", "--workers", "1")
    r2, two = plan(data, tiny_llama, tmp_path / "two.json", "--workers", "2")
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    keep = ("samples", "rejects", "tokens", "loss_masked_tokens", "length_percentiles", "overlong", "formats")
    assert {k: one[k] for k in keep} == {k: two[k] for k in keep}
    assert one["samples"] == len(exp.samples) and two["tokenization"]["workers"] == 2
    assert one["tokens"] == sum(len(ids) for ids, _ in exp.samples.values())


def _record_written(out: Path, exp, done: list[int]) -> None:
    """Put `done` (dataset indices of `exp`) in the manifest of `out`, as the drain records samples."""
    app = ManifestAppender(out)
    app.append(
        [ManifestEntry(n, i, f"hsx-0-{i}", len(exp.samples[i][0]), f"f{n}", 1, "sha256:0") for n, i in enumerate(done)]
    )
    app.close()


def test_samples_already_written_are_counted_and_left_out_of_what_remains(tiny_llama, tmp_path):
    data, exp = _dataset(tmp_path, tiny_llama)
    out = tmp_path / "out"
    out.mkdir()
    done = sorted(exp.samples)[:10]
    _record_written(out, exp, done)
    r, report = plan(data, tiny_llama, tmp_path / "plan.json", "--output", str(out), "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert report["already_written"] == 10
    assert report["remaining_tokens"] == report["tokens"] - sum(len(exp.samples[i][0]) for i in done)


def test_a_volume_too_small_fails_with_the_numbers_after_writing_the_report(tiny_llama, tmp_path):
    data, _ = _dataset(tmp_path, tiny_llama, n=20)
    r, report = plan(
        data,
        tiny_llama,
        tmp_path / "plan.json",
        "--output",
        str(tmp_path / "out"),
        "--space-margin",
        "1000T",
        "--workers",
        "1",
        "--format",
        "specforge",
    )
    assert r.returncode == 5, r.stdout + r.stderr
    v = report["output_volume"]
    assert v["ok"] is False and v["margin_bytes"] == 1000 << 40 and v["format"] == "specforge"
    assert f"{tmp_path / 'out'} has " in r.stderr and "but the run needs" in r.stderr
    assert "specforge training set" in r.stderr and "--space-margin" in r.stderr
    started = subprocess.run(
        [
            sys.executable,
            "-m",
            "hsextract",
            "plan",
            "--dataset",
            str(data),
            "--model",
            str(tiny_llama),
            "--json",
            str(tmp_path / "p2.json"),
            "--no-progress",
            "--workers",
            "1",
            "--output",
            str(tmp_path / "out"),
            "--space-margin",
            "1000T",
            "--no-space-check",
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert started.returncode == 0, started.stderr


def test_staging_need_is_check_shms_estimate_for_the_longest_sample(tiny_llama, tmp_path):
    data, _ = _dataset(tmp_path, tiny_llama, n=20)
    r, report = plan(
        data,
        tiny_llama,
        tmp_path / "plan.json",
        "--workers",
        "1",
        "--max-in-flight",
        "3",
        "--max-staged",
        "5",
        "--shm-min-free",
        "1M",
    )
    assert r.returncode == 0, r.stderr
    s = report["shm"]
    assert s["tokens_per_request"] == report["length_percentiles"]["max"] and s["requests"] == 5
    assert check_shm_need(tiny_llama, s["tokens_per_request"], "--shm-min-free", "1M") == s["need_bytes"]


def test_staging_need_of_a_capture_that_stages_fp8_is_check_shms_fp8_estimate(tiny_llama, tmp_path):
    data, _ = _dataset(tmp_path, tiny_llama, n=20)
    args = ("--max-in-flight", "3", "--max-staged", "5", "--shm-min-free", "1", "--capture-precision")
    bf16 = plan(data, tiny_llama, tmp_path / "bf16.json", "--workers", "1", *args, "bf16")[1]["shm"]
    r, report = plan(data, tiny_llama, tmp_path / "fp8.json", "--workers", "1", "--precision", "fp8", *args, "fp8")
    assert r.returncode == 0, r.stderr
    s = report["shm"]
    assert (s["bytes_per_token"], bf16["bytes_per_token"]) == (64 * 4 + 12, 64 * 4 * 2 + 8)
    assert s["need_bytes"] < bf16["need_bytes"]
    need = check_shm_need(tiny_llama, s["tokens_per_request"], "--shm-min-free", "1", "--capture-precision", "fp8")
    assert need == s["need_bytes"]


def check_shm_need(model, tokens_per_request: int, *flags: str) -> int:
    """`hsextract check-shm`'s staging need for 3 requests in flight and 5 staged of this length."""
    check = hsextract(
        "check-shm",
        "--model",
        str(model),
        "--max-in-flight",
        "3",
        "--max-staged",
        "5",
        "--max-tokens",
        str(tokens_per_request),
        *flags,
    )
    assert check.returncode == 0, check.stderr
    return json.loads(check.stdout)["need_bytes"]


def test_a_missing_dataset_is_an_error_naming_it(tiny_llama, tmp_path):
    r, _ = plan(tmp_path / "nope.jsonl", tiny_llama, tmp_path / "plan.json", "--workers", "1")
    assert r.returncode == 2 and "nope.jsonl does not exist" in r.stderr


def test_an_empty_dataset_file_is_an_error_as_an_empty_directory_is(tiny_llama, tmp_path):
    (tmp_path / "d.jsonl").write_bytes(b"")
    r, report = plan(tmp_path / "d.jsonl", tiny_llama, tmp_path / "plan.json", "--workers", "1")
    assert r.returncode == 2 and "d.jsonl is empty (0 bytes)" in r.stderr and not report


def test_a_shard_with_no_sample_to_send_needs_no_staging(tiny_llama, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"messages": "not a conversation"}\n')
    r, report = plan(data, tiny_llama, tmp_path / "plan.json", "--workers", "1", "--shm-min-free", "10%")
    assert r.returncode == 0, r.stderr
    assert report["samples"] == 0 and sum(report["rejects"].values()) == 1
    assert (report["shm"]["requests"], report["shm"]["need_bytes"], report["shm"]["ok"]) == (0, 0, True)
    assert "/dev/shm  nothing to stage: no sample of this shard is left to send" in r.stdout, r.stdout


def test_no_more_requests_are_staged_than_there_are_samples_to_send(tiny_llama, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(_conversation(0) + "\n" + _conversation(1) + "\n")
    r, report = plan(data, tiny_llama, tmp_path / "plan.json", "--workers", "1", "--max-in-flight", "256")
    assert r.returncode == 0, r.stderr
    assert report["shm"]["requests"] == 2
    assert "for 2 requests x" in r.stdout, r.stdout


def _conversation(i: int, text: str = "") -> str:
    return json.dumps(
        {
            "messages": [
                {"role": "user", "content": f"Question {i}? {text}"},
                {"role": "assistant", "content": f"Answer {i}."},
            ]
        }
    )


def test_a_row_over_the_size_bound_is_a_reject_of_its_own_and_the_bound_can_be_raised(tiny_llama, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join([_conversation(0), _conversation(1, "x" * 300_000), _conversation(2)]) + "\n")
    r, report = plan(data, tiny_llama, tmp_path / "plan.json", "--workers", "1", "--max-row-bytes", "100000")
    assert r.returncode == 0, r.stderr
    assert report["samples"] == 2 and report["rejects"] == {"row_too_large": 1}
    assert report["reject_examples"]["row_too_large"].startswith("data.jsonl:2: the row has 300,")
    r, report = plan(data, tiny_llama, tmp_path / "plan2.json", "--workers", "1", "--max-row-bytes", "1000000")
    assert r.returncode == 0 and "row_too_large" not in report["rejects"], r.stderr


def test_reject_examples_name_the_file_and_row_of_every_reason(tiny_llama, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "a.jsonl").write_text(_conversation(0) + "\n")
    (d / "b.jsonl").write_text(_conversation(1) + "\n" + json.dumps({"input_ids": [1, 10**6]}) + "\n{bad\n")
    r, report = plan(d, tiny_llama, tmp_path / "plan.json", "--workers", "1")
    assert r.returncode == 0, r.stderr
    examples = report["reject_examples"]
    assert examples["bad_input_ids"].startswith("b.jsonl:2: token id 1000000 is outside the vocabulary")
    assert examples["malformed_json"].startswith("b.jsonl:3: ")


def _plan_in_process(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["plan", *argv])
    return rc, out.getvalue(), err.getvalue()


def test_a_plan_given_no_place_for_its_report_writes_nothing_and_says_so_first(tiny_llama, tmp_path, monkeypatch):
    data, _ = _dataset(tmp_path, tiny_llama, n=10)
    work = tmp_path / "started-here"
    work.mkdir()
    monkeypatch.chdir(work)
    rc, out, err = _plan_in_process(
        "--dataset", str(data), "--model", str(tiny_llama), "--no-progress", "--workers", "1", *LIMITS
    )
    assert rc == 0 and "samples" in out, err
    assert err.splitlines()[0] == (
        "plan: no --output or --json: the report and the scan are kept nowhere (--json "
        "PATH keeps them, and a later plan of the same inputs reuses the scan)"
    )
    assert list(work.iterdir()) == [], "no plan.json or plan.scan.json where the plan was started"


def test_a_plan_says_once_which_files_of_a_dataset_directory_it_skips(tiny_llama, tmp_path, caplog):
    d = tmp_path / "data"
    d.mkdir()
    (d / "a.jsonl").write_text(_conversation(0) + "\n")
    (d / ".notes.jsonl").write_text(_conversation(1) + "\n")
    with caplog.at_level(logging.INFO, logger="hsextract"):
        rc, _, err = _plan_in_process(
            "--dataset",
            str(d),
            "--model",
            str(tiny_llama),
            "--no-progress",
            "--workers",
            "1",
            "--json",
            str(tmp_path / "plan.json"),
        )
    assert rc == 0, err
    said = [r.getMessage() for r in caplog.records if "hidden files" in r.getMessage()]
    assert said == [f"dataset {d}: skipping 1 hidden files and directories (names starting with . or _): .notes.jsonl"]


def test_planning_a_read_only_output_reports_and_says_in_one_line_that_the_report_was_not_kept(tiny_llama, tmp_path):
    from support.read_only import hsextract_read_only

    data, _ = _dataset(tmp_path, tiny_llama, n=10)
    out = tmp_path / "out"
    out.mkdir()
    base = [
        "plan",
        "--dataset",
        str(data),
        "--model",
        str(tiny_llama),
        "--output",
        str(out),
        "--no-progress",
        "--workers",
        "1",
    ]
    r = hsextract_read_only([out], *base)
    assert r.returncode == 0, r.stderr
    assert "samples" in r.stdout and "output    room" in r.stdout
    kept = [line for line in r.stderr.splitlines() if "report" in line]
    assert kept == [
        f"  report    not kept: cannot write {out / '.hsextract' / 'plan.json'} (Read-only file system); "
        "the plan above stands, --json PATH keeps it elsewhere"
    ], r.stderr
    assert (
        f"  scan      not kept for the next plan: cannot write {out / '.hsextract' / 'plan.scan.json'} "
        "(Read-only file system)" in r.stderr.splitlines()
    ), r.stderr
    asked = hsextract_read_only([out], *base, "--json", str(out / "plan.json"))
    assert asked.returncode == 73
    assert asked.stderr.strip().splitlines()[-1] == (
        f"hsextract plan: error: cannot write the report to {out / 'plan.json'} (Read-only file system); "
        "pass --json with a writable path"
    )


# ---- a plan of the same inputs reuses the scan kept beside its report -------------------------------
# The play plans at every run, and tokenizing a large dataset again takes minutes.

# What a plan measures of the dataset; the rest (free space, the tokenizer's speed) is of the moment.
MEASURED = (
    "samples",
    "already_written",
    "rejects",
    "reject_examples",
    "tokens",
    "loss_masked_tokens",
    "remaining_tokens",
    "length_percentiles",
    "overlong",
    "formats",
    "dataset_fingerprint",
    "rows",
    "rows_in_shard",
    "model_layout",
)


def measured(report: dict) -> dict:
    return {k: report[k] for k in MEASURED}


def test_a_second_plan_of_the_same_inputs_reuses_the_scan_and_reports_the_same(tiny_llama, tmp_path):
    data, _ = _dataset(tmp_path, tiny_llama, n=30)
    r1, first = plan(data, tiny_llama, tmp_path / "plan.json", "--workers", "1")
    kept = tmp_path / "plan.scan.json"
    written = kept.stat().st_mtime_ns
    r2, second = plan(data, tiny_llama, tmp_path / "plan.json", "--workers", "1")
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    assert (first["tokenization"]["reused"], second["tokenization"]["reused"]) == (False, True)
    assert measured(second) == measured(first)
    assert "tokenized earlier: the scan kept beside the report" in r2.stdout
    assert kept.stat().st_mtime_ns == written, "a reused scan is not written again"


def test_a_changed_dataset_or_setting_is_scanned_again(tiny_llama, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(_conversation(i) + "\n" for i in range(5)))
    assert plan(data, tiny_llama, tmp_path / "plan.json", "--workers", "1")[0].returncode == 0
    with data.open("a") as f:
        f.write(_conversation(5) + "\n")
    r, grown = plan(data, tiny_llama, tmp_path / "plan.json", "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert not grown["tokenization"]["reused"] and grown["samples"] == 6
    r, shorter = plan(data, tiny_llama, tmp_path / "plan.json", "--workers", "1", "--max-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert not shorter["tokenization"]["reused"] and shorter["overlong"]["max_tokens"] == 8


def test_samples_written_since_the_kept_scan_are_taken_out_of_what_remains(tiny_llama, tmp_path):
    data, exp = _dataset(tmp_path, tiny_llama, n=30)
    out = tmp_path / "out"
    out.mkdir()
    assert plan(data, tiny_llama, tmp_path / "plan.json", "--output", str(out), "--workers", "1")[0].returncode == 0
    _record_written(out, exp, sorted(exp.samples)[:7])
    r, reused = plan(data, tiny_llama, tmp_path / "plan.json", "--output", str(out), "--workers", "1")
    r2, fresh = plan(data, tiny_llama, tmp_path / "fresh.json", "--output", str(out), "--workers", "1", "--rescan")
    assert r.returncode == 0 and r2.returncode == 0, r.stderr + r2.stderr
    assert reused["tokenization"]["reused"] and not fresh["tokenization"]["reused"]
    assert reused["already_written"] == 7
    assert measured(reused) == measured(fresh)


def test_rescan_scans_again_and_a_damaged_kept_scan_is_scanned_again(tiny_llama, tmp_path):
    data, _ = _dataset(tmp_path, tiny_llama, n=20)
    r, first = plan(data, tiny_llama, tmp_path / "plan.json", "--workers", "1")
    assert r.returncode == 0, r.stderr
    r, again = plan(data, tiny_llama, tmp_path / "plan.json", "--workers", "1", "--rescan")
    assert r.returncode == 0 and not again["tokenization"]["reused"], r.stderr
    kept = tmp_path / "plan.scan.json"
    doc = json.loads(kept.read_text())
    doc["scan"]["tokens"] = doc["scan"]["tokens"][:-1]  # one sample's column cut short
    kept.write_text(json.dumps(doc))
    r, after = plan(data, tiny_llama, tmp_path / "plan.json", "--workers", "1")
    assert r.returncode == 0 and not after["tokenization"]["reused"], r.stderr
    assert measured(after) == measured(first)
    kept.write_bytes(b"\0not json")
    r, after = plan(data, tiny_llama, tmp_path / "plan.json", "--workers", "1")
    assert r.returncode == 0 and not after["tokenization"]["reused"], r.stderr
    assert measured(after) == measured(first)


def test_the_kept_scan_of_one_report_is_not_another_reports(tiny_llama, tmp_path):
    data, _ = _dataset(tmp_path, tiny_llama, n=10)
    assert plan(data, tiny_llama, tmp_path / "a.json", "--workers", "1")[0].returncode == 0
    r, b = plan(data, tiny_llama, tmp_path / "b.json", "--workers", "1")
    assert r.returncode == 0 and not b["tokenization"]["reused"], r.stderr
    assert sorted(p.name for p in Path(tmp_path).glob("*.scan.json")) == ["a.scan.json", "b.scan.json"]


def test_measure_disk_gives_the_output_volumes_ceiling_and_which_of_it_and_the_gpu_sets_the_pace(tiny_llama, tmp_path):
    data, _ = _dataset(tmp_path, tiny_llama, n=20)
    out = tmp_path / "out"
    out.mkdir()
    quick = (
        "--measure-disk",
        "--measure-disk-seconds",
        "0.2",
        "--measure-disk-gb",
        "0.05",
        "--workers",
        "1",
        "--output",
        str(out),
    )
    r, slow_gpu = plan(data, tiny_llama, tmp_path / "plan.json", *quick, "--tokens-per-s", "1")
    assert r.returncode == 0, r.stderr
    d = slow_gpu["disk"]
    assert d["directory"] == str(out) and [p["writers"] for p in d["points"]] == [1, 4, 8, 16]
    assert d["disk_ceiling_gb_per_s"] == max(p["gb_per_s"] for p in d["points"]) > 0
    assert d["paced_by"] == "gpu" and "the GPU sets the run's pace" in r.stdout
    assert 1 <= d["drain_workers"] <= d["best_writers"] and f"--workers {d['drain_workers']}" in r.stdout
    assert list(out.iterdir()) == [], "the measurement leaves nothing behind"
    r, fast_gpu = plan(data, tiny_llama, tmp_path / "plan2.json", *quick, "--tokens-per-s", "1e13")
    assert fast_gpu["disk"]["paced_by"] == "disk" and "the DISK sets the run's pace" in r.stdout
