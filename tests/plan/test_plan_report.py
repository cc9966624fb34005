"""The plan's report as a record (hsextract.plan.report): its JSON is that of the dict before it,
key for key, it prints as it printed, and it carries every key the plan role hands on to
``hsextract fleet plan`` (roles/plan/tasks/fleet.yml)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from hsextract.fleet.plan import plan_fleet
from hsextract.fleet.plan_input import REPORT_FIELDS, host_plans, report_problem
from hsextract.plan.report import PlanReport
from hsextract.plan.text import render

ROLE_TASKS = Path(__file__).resolve().parents[2] / "roles" / "plan" / "tasks"

# `hsextract plan --json` of a 32-line dataset with the tiny Llama and --measure-disk, as the plan
# wrote it while the report was a dict (the paths, the digest, the free space and the times made up).
WRITTEN: dict = {
    "dataset": "/data/train.jsonl",
    "model": "/models/tiny-llama",
    "shard": "0/1",
    "format": "speculators",
    "precision": "bf16",
    "dataset_fingerprint": {
        "method": "sha256-of-heads-v1",
        "files": [
            {"name": None, "bytes": 14451, "sha256": "abababababababababababababababababababababababababababababababab"}
        ],
    },
    "rows": 32,
    "rows_in_shard": 32,
    "samples": 20,
    "already_written": 0,
    "rejects": {"duplicate": 10, "malformed_json": 1, "too_long": 1},
    "reject_examples": {
        "too_long": "train.jsonl:32: 2005 tokens; no assistant token within the first 300",
        "duplicate": "train.jsonl:12: same sample as train.jsonl:6",
        "malformed_json": "train.jsonl:31: Expecting value: line 1 column 1 (char 0)",
    },
    "tokens": 4671,
    "loss_masked_tokens": 2536,
    "remaining_tokens": 4671,
    "length_percentiles": {"p50": 300.0, "p90": 300.0, "p99": 300.0, "max": 300, "min": 22, "mean": 233.6},
    "overlong": {"max_tokens": 300, "policy": "truncate", "samples": 12, "truncated": 11, "skipped": 1},
    "model_layout": {"hidden_size": 64, "num_aux": 3, "dtype": "bfloat16", "num_hidden_layers": 8, "vocab_size": 320},
    "formats": {
        "specforge": {
            "sample_bytes": 2511556,
            "bookkeeping_bytes_estimate": 97104,
            "total_bytes": 2608660,
            "remaining_bytes": 2608660,
        },
        "speculators": {
            "sample_bytes": 2471040,
            "bookkeeping_bytes_estimate": 172480,
            "total_bytes": 2643520,
            "remaining_bytes": 2643520,
        },
        "speculators fp8": {
            "sample_bytes": 1295556,
            "bookkeeping_bytes_estimate": 172480,
            "total_bytes": 1468036,
            "remaining_bytes": 1468036,
        },
        "speculators-v1": {
            "sample_bytes": 2518628,
            "bookkeeping_bytes_estimate": 97424,
            "total_bytes": 2616052,
            "remaining_bytes": 2616052,
        },
        "modelopt": {
            "sample_bytes": 2511108,
            "bookkeeping_bytes_estimate": 97104,
            "total_bytes": 2608212,
            "remaining_bytes": 2608212,
        },
    },
    "shm": {
        "path": "/dev/shm",
        "mount": "/dev/shm",
        "free_bytes": 25275150336,
        "need_bytes": 2527620300,
        "ok": True,
        "requests": 256,
        "tokens_per_request": 300,
        "bytes_per_token": 520,
        "estimate_bytes": 43081728,
        "watermark_bytes": 2527620300,
    },
    "time": {"tokens_per_s": 1.0, "source": "--tokens-per-s", "seconds": 4671.0},
    "output_volume": {
        "path": "/out",
        "format": "speculators",
        "free_bytes": 72888897536,
        "need_bytes": 2643520,
        "margin_bytes": 132176,
        "margin": "5%",
        "ok": True,
    },
    "tokenization": {"workers": 1, "seconds": 0.058, "reused": False, "samples_per_s": 552.5},
    "disk": {
        "directory": "/out",
        "disk_ceiling_gb_per_s": 0.338,
        "best_writers": 8,
        "file_sizes": [158705],
        "points": [{"writers": 8, "files": 64, "bytes": 10157120, "seconds": 0.03, "gb_per_s": 0.338}],
        "bytes_per_token": 529.0,
        "drain_workers": 2,
        "run_bytes_per_s": 529,
        "disk_tokens_per_s": 639525,
        "paced_by": "gpu",
    },
}

PRINTED = [
    "plan: /data/train.jsonl with /models/tiny-llama (shard 0/1)",
    "  samples   20 of 32 rows in this shard (0 already written); rejects: duplicate 10, malformed_json 1, too_long 1",
    "  tokens    4,671 (2,536 loss-masked); per sample p50 300, p90 300, p99 300, max 300",
    "  overlong  12 samples over 300 tokens (11 truncated, 1 skipped)",
    "  specforge           2.5 MiB (2.4 MiB of sample files)",
    "  speculators         2.5 MiB (2.4 MiB of sample files) <-",
    "  speculators fp8     1.4 MiB (1.2 MiB of sample files)",
    "  speculators-v1      2.5 MiB (2.4 MiB of sample files)",
    "  modelopt            2.5 MiB (2.4 MiB of sample files)",
    "  /dev/shm  needs 2.4 GiB for 256 requests x 300 tokens at /dev/shm; 23.5 GiB free",
    "  time      1 h 17 min for 4,671 tokens at 1 tokens/s (--tokens-per-s)",
    "  output    room: 67.9 GiB free at /out, the run needs 2.5 MiB + 129.1 KiB margin (speculators)",
    "  disk      ceiling 338.0 MB/s at /out (8 writers, files of 155.0 KiB-155.0 KiB, fsync each): "
    "at most 639,525 tokens/s at 529 B per token",
    "  pace      the GPU sets the run's pace: it makes 529 B/s, within what the volume takes",
    "  workers   the volume took files fastest from 8 writers: `hsextract drain --workers 2` on this host's cores",
    "  tokenized 552 samples/s on 1 processes",
]

# The report without a rate, of a reused scan, with staging and the output volume too small.
PRINTED_WORST = [
    "plan: /data/train.jsonl with /models/tiny-llama (shard 0/1)",
    "  samples   20 of 32 rows in this shard (0 already written); rejects: duplicate 10, malformed_json 1, too_long 1",
    "  overlong  12 samples over 300 tokens (11 truncated, 1 skipped)",
    "  specforge           2.5 MiB (2.4 MiB of sample files)",
    "  speculators         2.5 MiB (2.4 MiB of sample files) <-",
    "  speculators fp8     1.4 MiB (1.2 MiB of sample files)",
    "  speculators-v1      2.5 MiB (2.4 MiB of sample files)",
    "  modelopt            2.5 MiB (2.4 MiB of sample files)",
    "  /dev/shm  needs 2.4 GiB for 256 requests x 300 tokens at /dev/shm; 23.5 GiB free (TOO SMALL)",
    "  time      unknown (no rate: pass --tokens-per-s)",
    "  output    NOT ENOUGH ROOM: 67.9 GiB free at /out, the run needs 2.5 MiB + 129.1 KiB margin (speculators)",
    "  disk      ceiling 338.0 MB/s at /out (8 writers, files of 155.0 KiB-155.0 KiB, fsync each): "
    "at most ? tokens/s at 529 B per token",
    "  pace      unknown: no prefill rate (pass --tokens-per-s)",
    "  workers   the volume took files fastest from 8 writers: `hsextract drain --workers 2` on this host's cores",
    "  tokenized earlier: the scan kept beside the report, of the same dataset, model and settings "
    "(--rescan scans again)",
]


def without_disk(data: dict) -> dict:
    return {k: v for k, v in data.items() if k != "disk"}


def test_a_report_read_from_its_json_writes_the_same_json_byte_for_byte():
    for data in (WRITTEN, without_disk(WRITTEN)):
        report = PlanReport.from_json(data)
        assert json.dumps(report.to_json(), indent=2) == json.dumps(data, indent=2)
        assert PlanReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    assert PlanReport.from_json(without_disk(WRITTEN)).disk is None


def test_the_report_reads_as_fields():
    r = PlanReport.from_json(WRITTEN)
    assert (r.format_bytes.remaining_bytes, r.output_volume.ok, r.time.seconds) == (2643520, True, 4671.0)
    assert (r.shm.need_bytes, r.overlong.skipped, r.model_layout.hidden_size) == (2527620300, 1, 64)
    assert r.disk is not None and (r.disk.paced_by, r.disk.ceiling["best_writers"]) == ("gpu", 8)
    assert list(r.formats) == ["specforge", "speculators", "speculators fp8", "speculators-v1", "modelopt"]


def fp8_run(data: dict) -> dict:
    """`data` as the plan of a run with --precision fp8 writes it: its room checked for the FP8 files."""
    fp8 = data["formats"]["speculators fp8"]["remaining_bytes"]
    volume = {**data["output_volume"], "format": "speculators", "need_bytes": fp8, "margin_bytes": fp8 // 20}
    return {**copy.deepcopy(data), "precision": "fp8", "output_volume": volume}


def test_a_run_of_fp8_rows_is_planned_with_its_fp8_bytes_and_bf16_staging():
    """The plan sizes FP8 files as the drain writes them (tests/plan/test_plan.py); the room, the fleet
    and the text take the run's own entry, and /dev/shm is sized for the staged rows as captured."""
    data = fp8_run(WRITTEN)
    r = PlanReport.from_json(data)
    assert r.format_bytes.remaining_bytes == 1468036 and r.shm.bytes_per_token == 520
    text = render(r).splitlines()
    assert "  speculators fp8     1.4 MiB (1.2 MiB of sample files) <-" in text
    assert "  speculators         2.5 MiB (2.4 MiB of sample files)" in text
    assert text[9].endswith("23.5 GiB free (staged as captured: the drain quantizes to fp8)"), text[9]
    assert text[11].endswith("the run needs 1.4 MiB + 71.7 KiB margin (speculators fp8)"), text[11]
    assert report_problem(data) == ""
    hosts = host_plans({"a": {"shard": "0/1", "report": data, "rc": 0, "error": ""}})
    assert plan_fleet("gpu", hosts).totals()["remaining_bytes"] == 1468036


def test_the_report_prints_as_the_plan_printed_it():
    assert render(PlanReport.from_json(WRITTEN)).splitlines() == PRINTED
    worst = copy.deepcopy(WRITTEN)
    worst["time"] = {"tokens_per_s": None, "source": "no rate: pass --tokens-per-s", "seconds": None}
    worst["tokenization"]["reused"] = True
    worst["shm"]["ok"] = worst["output_volume"]["ok"] = False
    worst["disk"].update(run_bytes_per_s=None, disk_tokens_per_s=None, paced_by="unknown")
    worst["length_percentiles"] = {}
    assert render(PlanReport.from_json(worst)).splitlines() == PRINTED_WORST


def test_the_report_has_every_key_the_plan_role_hands_to_the_fleets_plan():
    """fleet.yml slurps each host's report and hands it, as JSON, to `hsextract fleet plan -`, which
    reads REPORT_FIELDS, time.seconds, formats.<format>.remaining_bytes and output_volume's ok and
    free_bytes; the role's own test reads samples, format and output_volume.ok."""
    fleet_yml = (ROLE_TASKS / "fleet.yml").read_text()
    assert 'src: "{{ plan_report }}"' in fleet_yml and "plan__report.content | b64decode | from_json" in fleet_yml
    assert "'--json', plan_report" in (ROLE_TASKS / "main.yml").read_text()

    def written(shard: str) -> dict:
        report = PlanReport.from_json({**WRITTEN, "shard": shard, "rows_in_shard": 16})
        return json.loads(json.dumps(report.to_json()))  # as the controller reads the slurped file

    data = written("0/2")
    assert [k for k in REPORT_FIELDS if k not in data] == []
    assert report_problem(data) == ""
    assert data["time"]["seconds"] == 4671.0 and data["formats"][data["format"]]["remaining_bytes"] == 2643520
    volume = data["output_volume"]
    assert (data["samples"], volume["ok"], volume["free_bytes"]) == (20, True, 72888897536)
    hosts = host_plans(
        {h: {"shard": s, "report": written(s), "rc": 0, "error": ""} for h, s in (("a", "0/2"), ("b", "1/2"))}
    )
    plan = plan_fleet("gpu", hosts)
    assert plan.problems == []
    t = plan.totals()
    assert (t["planned"], t["samples"], t["remaining_bytes"], t["seconds"]) == (2, 40, 2 * 2643520, 4671.0)


def test_the_kept_sizes_read_back_as_the_records_they_were_and_a_bad_entry_is_none(tmp_path):
    from hsextract.plan.reuse import Kept

    formats = PlanReport.from_json(WRITTEN).formats
    kept = Kept(tmp_path / "plan.scan.json")
    kept.keep_sizes("k", formats)
    assert kept.write() is None
    again = Kept(tmp_path / "plan.scan.json")
    assert again.sizes("k") == formats and again.sizes("other") is None
    again.data["sizes"]["formats"]["speculators"] = {"sample_bytes": 1}
    assert again.sizes("k") is None, "an entry of another shape is sized again, never an error"
