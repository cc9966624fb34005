"""A fleet of real hosts: `extract.yml` over SSH on two systemd sandboxes, each in a network
namespace of its own with its own sshd (support.hosts), then `collect.yml` onto one of them.

One fleet per session, and the life of a real fleet run, in this order:

1. ``extract.yml`` over the group {a, b}: each host takes its shard k/2 of one 24-row dataset and
   records the fleet's run identity; the play returns with the run going on;
2. host b's client and drain are stopped mid-run, once two of its samples are written (its server
   keeps serving, as when an operator stops the run; the play starting a stopped server is the
   converge's, tested in test_extract_playbook);
3. ``extract.yml -e wait=true`` again: a changes nothing, b resumes, both finish;
4. ``playbooks/status.yml``: the fleet's table, and its JSON in a file on the controller;
5. ``collect.yml`` onto host a, its ``hsextract collect`` killed with SIGKILL with its batch
   fetched and nothing committed; run again, it finishes; an uninterrupted collect into another
   directory gives the same set.

Both interruptions are made on the host itself the moment its run reaches them
(support/fleet_interrupts.py): from the test, b could finish its shard before the stop landed,
and the collect commit its batch before the kill.

The tests then read what that left, and bad inventories run against the converged fleet: each
stops with one line and leaves the hosts' training sets as they were.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from hsextract.output.manifest import iter_entries
from support import fleet_interrupts
from support.client_run import wait_for
from support.hosts import Fleet, missing_requirements
from support.playbook_sandbox import REPO, PlayResult, snapshot_repo

pytestmark = [pytest.mark.slow, pytest.mark.sandbox, pytest.mark.server, pytest.mark.timeout(3600)]

LINES = 24  # the dataset: the first rows of the demo dataset (chat, ShareGPT and pre-tokenized rows)
STOPPED_AT = 2  # host b's units are stopped once this many of its samples are in its set
UNITS = ("hsextract-extract.service", "hsextract-drain.service")  # host b's, stopped mid-run
ENCODE = """import json, sys
from hsextract.dataset.chat_template import SampleEncoder, load_tokenizer
from hsextract.dataset.reader import Sample, read_dataset
encoder = SampleEncoder(load_tokenizer(sys.argv[1]), int(sys.argv[3]), "truncate")
print(json.dumps({item.index: encoder.encode(item).input_ids for item in read_dataset(sys.argv[2])
                  if isinstance(item, Sample)}))
"""


def group_vars(controller: Path) -> dict:
    """The settings every host shares (as inventory/local.yml's); each host's output and model are in its own
    home, bound into it only (host vars)."""
    return {
        "hsextract_venv": os.environ["HSEXTRACT_VENV"],
        "hsextract_tiny_model": "llama",
        "hsextract_model_path": "/var/lib/hsextract/models/tiny-llama",
        "hsextract_dataset": "/var/lib/hsextract/datasets/train.jsonl",
        "hsextract_dataset_src": str(controller / "train.jsonl"),
        "hsextract_format": "speculators",
        "hsextract_max_in_flight": 1,
        "hsextract_max_tokens": 512,
        "hsextract_max_staged": 32,
        "hsextract_shm_min_free": "16M",
        "sglang_server_chunked_prefill_size": 64,
        "sglang_server_max_total_tokens": 4096,
        "sglang_server_start_timeout": 300,
    }


def output_of(fleet: Fleet, name: str) -> Path:
    return fleet.hosts[name].home / "output"


def client_summaries(out: Path) -> list[Path]:
    """The client's summary (one per shard: a fleet's host names its file for its shard)."""
    return sorted((out / ".hsextract").glob("client-summary*.json"))


def manifest_indices(out: Path) -> list[int]:
    """The dataset indices in a host's set, in its order (a line the drain is writing is left out)."""
    try:
        text = (out / "manifest.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line)["dataset_index"] for line in text.split("\n")[:-1]]


def read_json(path: Path) -> dict | None:
    """A report the host wrote whole (by rename), or None before it has."""
    return json.loads(path.read_text()) if path.exists() else None


def interrupt(f: Fleet, name: str, *args: str) -> None:
    """Start support/fleet_interrupts.py on host `name` (a transient unit): it acts when the run gets there.
    The script is copied into the host's home, as the host sees no other directory of the test's."""
    script = shutil.copy(fleet_interrupts.__file__, f.hosts[name].home / "fleet_interrupts.py")
    f.hosts[name].box.run(
        "systemd-run", f"--unit=hsx-test-{args[0]}", "--quiet", "/usr/bin/python3", str(script), *args, check=True
    )


@pytest.fixture(scope="session")
def fleet(tmp_path_factory):
    """Two hosts after the run in the module docstring; the plays' results by step."""
    why = missing_requirements()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("fleet")
    repo = snapshot_repo(base / "repo")
    controller = base / "controller"
    controller.mkdir()
    rows = (REPO / "files" / "datasets" / "demo.jsonl").read_text().splitlines()[:LINES]
    (controller / "train.jsonl").write_text("\n".join(rows) + "\n")
    f = Fleet(base / "hosts", uuid.uuid4().hex[:6])
    started = time.monotonic()
    try:
        f.open(["a", "b"])
        host_vars = {
            n: {"hsextract_output_dir": str(output_of(f, n)), "hsextract_model_path": str(f.hosts[n].home / "model")}
            for n in f.hosts
        }
        inventory = f.inventory(controller / "fleet.yml", host_vars, group_vars(controller))
        logs = base / "logs"
        state: dict = {
            "fleet": f,
            "repo": repo,
            "controller": controller,
            "inventory": inventory,
            "logs": logs,
            "host_vars": host_vars,
        }

        def play(label: str, playbook: str, *args: str, inv: Path = inventory, **extra) -> PlayResult:
            return f.playbook(repo, inv, playbook, *args, extra_vars=extra or None, log_dir=logs, label=label)

        state["play"] = play
        b, stopped = output_of(f, "b"), f.hosts["b"].home / "stopped.json"
        interrupt(f, "b", "stop-units", str(b), str(STOPPED_AT), str(stopped), *UNITS)
        state["first"] = play("1-extract", "extract.yml")
        if state["first"].rc == 0:
            state["b_stopped"] = wait_for(
                lambda: read_json(stopped), 600, "host b's units stopped after its first samples"
            )
            state["b_finished_at_stop"] = bool(client_summaries(b))
            state["b_written_after_stop"] = manifest_indices(b)
            state["b_units_after_stop"] = f.hosts["b"].box.run("systemctl", "is-active", *UNITS).stdout.split()
            state["second"] = play("2-extract-wait", "extract.yml", wait=True)
            state["status_file"] = controller / "fleet-status.json"
            state["status"] = play("3-status", "playbooks/status.yml", status_file=str(state["status_file"]))
            collect_vars = {
                "collect_collector": "a",
                "collect_final": True,
                "hsextract_python": f"{os.environ['HSEXTRACT_VENV']}/bin/python",
                "collect_draft_vocab_sizes": [64],
            }
            into = f.hosts["a"].home / "collected"
            killed = f.hosts["a"].home / "killed.json"
            interrupt(f, "a", "kill-collect", str(into), str(killed))
            state["collect_killed"] = play(
                "4-collect-killed", "playbooks/collect.yml", collect_into=str(into), **collect_vars
            )
            # Written once the killed collect's held sample is back: the next collect finds it.
            state["killed"] = wait_for(lambda: read_json(killed), 60, "the collect's killer's report")
            state["collect"] = play("5-collect-again", "playbooks/collect.yml", collect_into=str(into), **collect_vars)
            state["into"] = into
            state["into_whole"] = f.hosts["a"].home / "collected-whole"
            state["collect_whole"] = play(
                "6-collect-uninterrupted",
                "playbooks/collect.yml",
                collect_into=str(state["into_whole"]),
                **collect_vars,
            )
        state["run_seconds"] = time.monotonic() - started
        yield state
    finally:
        f.close()


def assert_ok(result: PlayResult, what: str, hosts=("a", "b")) -> None:
    failed = {h: result.failed_tasks(h) for h in hosts}
    assert result.rc == 0, f"{what} failed (rc {result.rc}): {failed}\n{result.log[-3000:]}"


def need(fleet, key: str):
    if key not in fleet:
        pytest.skip(f"the fleet's run stopped before {key}; see test_the_fleet_run_converges_on_every_host")
    return fleet[key]


# ---- the run -------------------------------------------------------------------------------------


def test_the_fleet_run_converges_on_every_host(fleet):
    assert_ok(fleet["first"], "the first extract.yml run over the fleet")
    assert fleet["first"].changed("a") > 0 and fleet["first"].changed("b") > 0
    print(f"fleet run (two hosts, up to the collects): {fleet['run_seconds']:.0f} s")


def test_each_host_takes_the_shard_of_its_place_in_the_group(fleet):
    f = fleet["fleet"]
    for k, name in enumerate(("a", "b")):
        config = json.loads(f.hosts[name].sh("cat /etc/hsextract/run.json"))
        assert config["shard"] == f"{k}/2", config
        (path,) = client_summaries(output_of(f, name))
        summary = json.loads(path.read_text())
        assert summary["shard"] == [k, 2] and summary["dataset_lines"] == LINES


def test_every_host_records_the_same_run_identity_and_dataset(fleet):
    need(fleet, "second")
    f = fleet["fleet"]
    runs = {n: json.loads((output_of(f, n) / "run.json").read_text())["run_id"] for n in f.hosts}
    headers = {n: json.loads((output_of(f, n) / "manifest.json").read_text())["run_id"] for n in f.hosts}
    datasets = {
        n: json.loads((output_of(f, n) / ".hsextract" / "dataset.json").read_text())["fingerprint"] for n in f.hosts
    }
    assert len(set(runs.values())) == 1 and runs == headers, (runs, headers)
    assert datasets["a"] == datasets["b"]


def test_the_fleet_plan_runs_before_anything_starts_and_covers_the_dataset(fleet):
    text = fleet["first"].result_of("Check the fleet's plan.", "a")["msg"]
    assert text.startswith(
        f"fleet plan: 2 hosts of group hsextract, dataset /var/lib/hsextract/datasets/train.jsonl ({LINES} rows)"
    ), text
    assert "the shards cover the dataset exactly once" in text, text
    names = [n for n, _ in fleet["first"].task_results("a")]
    assert names.index("plan : Check the fleet's plan.") < names.index("sglang_server : Install the server unit."), (
        "the fleet plan must come before any service"
    )


def test_a_host_stopped_mid_run_finishes_on_the_next_run_with_nothing_twice(fleet):
    assert_ok(need(fleet, "second"), "extract.yml -e wait=true after host b was stopped")
    f = fleet["fleet"]
    assert "lines_at_stop" in fleet["b_stopped"], f"host b was not stopped: {fleet['b_stopped']}"
    assert not fleet["b_finished_at_stop"], "host b had finished before its units were stopped: not mid-run"
    assert all(state in ("inactive", "failed") for state in fleet["b_units_after_stop"]), fleet["b_units_after_stop"]
    written_before = fleet["b_written_after_stop"]
    assert STOPPED_AT <= len(written_before) < LINES // 2
    after = manifest_indices(output_of(f, "b"))
    assert after[: len(written_before)] == written_before, "what b had written stays as it was"
    assert len(after) == len(set(after)), "a sample written twice"
    assert fleet["second"].changed("a") == 0, fleet["second"].changed_tasks("a")


def test_the_status_play_prints_one_fleet_table_and_writes_it_as_json(fleet):
    result = need(fleet, "status")
    assert_ok(result, "playbooks/status.yml")
    lines = result.result_of("Print the fleet's progress.", "a")["msg"]
    assert lines[0] == "fleet hsextract: 2 hosts", lines
    assert lines[1].split() == ["host", "state", "samples", "tokens", "rate", "ETA", "failed", "quarantined"]
    assert [line.split()[:2] for line in lines[2:5]] == [["a", "done"], ["b", "done"], ["fleet", "done"]], lines
    data = json.loads(fleet["status_file"].read_text())
    rec, hosts = data["reconciliation"], data["hosts"]
    assert data["ok"] and set(hosts) == {"a", "b"}
    assert rec["dataset_lines"] == rec["lines"] == LINES
    assert rec["lines"] == rec["accepted"] + rec["rejected"]
    assert rec["accepted"] == rec["in_set"] + rec["failed"] + rec["quarantined"]
    assert f"  fleet: {LINES} dataset lines = {rec['accepted']} accepted + {rec['rejected']} rejected" in lines
    assert hosts["a"]["in_set"] + hosts["b"]["in_set"] == rec["in_set"] == data["totals"]["in_set"]


# ---- the collect ---------------------------------------------------------------------------------


def test_a_collect_killed_mid_copy_finishes_on_the_next_run_with_the_uninterrupted_set(fleet):
    killed = need(fleet, "collect_killed")
    assert fleet["killed"].get("held"), f"the collect was not held at its last sample: {fleet['killed']}"
    assert fleet["killed"]["fetched_at_kill"] > 0 and fleet["killed"]["lines_at_kill"] == 0, fleet["killed"]
    assert killed.rc != 0, "the killed collect's play should fail"
    assert_ok(fleet["collect"], "collect.yml after the kill", hosts=("a",))
    assert_ok(fleet["collect_whole"], "an uninterrupted collect.yml", hosts=("a",))

    def content(into: Path) -> list[tuple]:
        return [
            (
                e.dataset_index,
                e.host,
                e.host_index,
                e.output_index,
                hashlib.sha256((into / e.file).read_bytes()).hexdigest(),
            )
            for e in iter_entries(into)
        ]

    assert content(fleet["into"]) == content(fleet["into_whole"])
    print(
        f"collect killed with {fleet['killed']['fetched_at_kill']} samples fetched, "
        f"{fleet['killed']['lines_at_kill']} committed"
    )


def test_the_collected_set_holds_every_accepted_sample_once_with_the_single_host_input_ids(fleet):
    need(fleet, "collect")
    f, into = fleet["fleet"], fleet["into"]
    readers = os.environ.get("HSEXTRACT_READERS")
    if not readers:
        pytest.skip("HSEXTRACT_READERS is not set (make venv installs the trainers' readers)")
    from support.reader_check import load_with_reader

    rejected = {
        json.loads(line)["index"]
        for n in f.hosts
        for path in (output_of(f, n) / ".hsextract").glob("rejects*.jsonl")
        for line in path.read_text().splitlines()
    }
    entries = sorted(iter_entries(into), key=lambda e: e.output_index)
    assert sorted(e.dataset_index for e in entries) == sorted(set(range(LINES)) - rejected)
    assert {e.host for e in entries} == {"a", "b"}
    # A single host's run sends each row as the client encodes it with the model's own tokenizer.
    encoded = json.loads(
        subprocess.run(
            [
                f"{os.environ['HSEXTRACT_VENV']}/bin/python",
                "-c",
                ENCODE,
                str(f.hosts["a"].home / "model"),
                str(fleet["controller"] / "train.jsonl"),
                "512",
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": str(REPO / "files" / "python")},
        ).stdout
    )
    loaded = load_with_reader(Path(readers), "speculators", into, num_aux=3, hidden=64)
    assert loaded["error_records"] == 0 and sorted(loaded["samples"]) == [e.output_index for e in entries]
    for e in entries:
        assert loaded["samples"][e.output_index]["input_ids"].tolist() == encoded[str(e.dataset_index)], e


# ---- bad input: one line, nothing written lost ----------------------------------------------------


def outputs_snapshot(f: Fleet) -> dict[str, tuple]:
    """What a bad run must leave as it was: every host's manifest, run id, dataset record and samples
    (the drain, still running, rewrites its status and may write the dataset-level files)."""
    out = {}
    for n in f.hosts:
        root = output_of(f, n)
        for p in [
            root / "manifest.json",
            root / "manifest.jsonl",
            root / "run.json",
            root / ".hsextract" / "dataset.json",
            *sorted((root / "hidden_states").glob("*")),
        ]:
            out[f"{n}/{p.relative_to(root)}"] = (p.stat().st_size, p.stat().st_mtime_ns)
    return out


def bad_run(
    fleet,
    label: str,
    *args: str,
    host_vars: dict | None = None,
    names: list[str] | None = None,
    groups: dict | None = None,
    **extra,
) -> PlayResult:
    need(fleet, "second")
    f = fleet["fleet"]
    merged = {n: {**fleet["host_vars"].get(n, {}), **(host_vars or {}).get(n, {})} for n in (names or list(f.hosts))}
    inv = f.inventory(
        fleet["controller"] / f"{label}.yml", merged, group_vars(fleet["controller"]), groups=groups, names=names
    )
    before = outputs_snapshot(f)
    result = fleet["play"](label, "extract.yml", *args, inv=inv, **extra)
    assert outputs_snapshot(f) == before, f"{label}: the hosts' training sets changed"
    return result


def failure_of(result: PlayResult, task: str) -> str:
    for host in ("a", "b", "a2"):
        for name, r in result.failed_tasks(host):
            if name.endswith(task):
                return r["msg"]
    raise AssertionError(f"no host failed at {task!r}: {result.log[-3000:]}")


def test_one_machine_under_two_names_stops_the_fleet_before_it_changes(fleet):
    f = fleet["fleet"]
    result = bad_run(
        fleet, "bad-alias", names=["a", "b", "a2"], host_vars={"a2": {"ansible_host": f.hosts["a"].address}}
    )
    assert result.rc != 0
    msg = failure_of(result, "Check that no machine is listed twice in the fleet.")
    assert msg.startswith(
        f"hsextract_fleet=hsextract lists one machine under several names: a and a2 are one machine "
        f"({f.hosts['a'].address}:22)."
    ), msg
    assert result.changed("a") == result.changed("b") == 0


def test_a_regeneration_per_host_is_refused_in_a_fleet_before_any_host_changes(fleet):
    result = bad_run(fleet, "bad-regenerate", hsextract_regenerate=True)
    assert result.rc != 0 and result.changed("a") == result.changed("b") == 0
    msg = failure_of(result, "Refuse the regeneration in a fleet of more than one host.")
    assert msg.startswith(
        "hsextract_regenerate=true with a fleet of 2 hosts (hsextract_fleet=hsextract): each host "
        "would regenerate its own shard into a dataset of its own"
    ), msg


def test_a_host_whose_volume_cannot_hold_its_shard_stops_every_host_at_the_plan(fleet):
    result = bad_run(fleet, "bad-room", "--tags", "plan", host_vars={"b": {"plan_space_margin": "1000T"}})
    assert result.rc != 0
    msg = failure_of(result, "Check the fleet's plan.")
    assert msg.startswith(
        f"The fleet cannot start: host b cannot hold its shard 1/2: {output_of(fleet['fleet'], 'b')} has "
    ), msg
    assert "but the run needs" in msg and "Nothing was started on any host." in msg, msg
    assert [n for n, _ in result.task_results("a")][-1] == "plan : Check the fleet's plan.", "a went on"


def test_shards_that_leave_part_of_the_dataset_to_no_host_stop_the_fleet_at_its_plan(fleet):
    result = bad_run(
        fleet,
        "bad-shards",
        "--tags",
        "plan",
        host_vars={"a": {"hsextract_shard": "0/3"}, "b": {"hsextract_shard": "1/3"}},
    )
    assert result.rc != 0
    msg = failure_of(result, "Check the fleet's plan.")
    assert msg.startswith(
        "The fleet cannot start: the hosts' shards do not cover the dataset: shard 2/3 is taken by "
        "no host (dataset indices 2, 5, 8, 11 ...). Nothing was started on any host."
    ), msg


def test_a_host_of_another_dataset_stops_the_fleet_at_its_plan(fleet):
    other = fleet["controller"] / "other.jsonl"
    other.write_text((fleet["controller"] / "train.jsonl").read_text().replace("France", "Spain"))
    result = bad_run(
        fleet,
        "bad-dataset",
        "--tags",
        "plan",
        host_vars={
            "b": {"hsextract_dataset": "/var/lib/hsextract/datasets/other.jsonl", "hsextract_dataset_src": str(other)}
        },
    )
    assert result.rc != 0
    msg = failure_of(result, "Check the fleet's plan.")
    assert msg.startswith(
        "The fleet cannot start: host b reads another dataset than host a: "
        "/var/lib/hsextract/datasets/other.jsonl differs from "
        "/var/lib/hsextract/datasets/train.jsonl in its first bytes (dataset fingerprint)."
    ), msg


def test_a_run_identity_other_than_the_hosts_record_stops_the_fleet(fleet):
    f = fleet["fleet"]
    run_id = json.loads((output_of(f, "a") / "run.json").read_text())["run_id"]
    result = bad_run(fleet, "bad-run", "--tags", "run_identity", hsextract_run_id="0badc0de")
    assert result.rc != 0
    msg = failure_of(result, "Check that the hosts' outputs record one run (and hsextract_run_id's, if set).")
    assert msg.startswith(
        f"the outputs of hsextract_fleet=hsextract record different runs (run.json): a {run_id}, "
        f"b {run_id} and hsextract_run_id is 0badc0de."
    ), msg


def test_a_missing_host_stops_no_other_and_shows_in_the_fleet_status(fleet):
    # Host b at an address of the fleet's own network that no host has: Ansible cannot reach it.
    result = bad_run(fleet, "missing-host", host_vars={"b": {"ansible_host": f"{fleet['fleet'].net}.250"}}, wait=True)
    assert result.rc == 4, "ansible-playbook says a host was unreachable"
    assert result.stats["b"]["unreachable"] > 0
    assert result.stats["a"]["failures"] == 0 and result.changed("a") == 0
    assert "Print the summary and where the training set is." in [
        n.split(" : ")[-1] for n, _ in result.task_results("a")
    ]
    inv = fleet["controller"] / "missing-host.yml"
    status = fleet["play"]("missing-host-status", "playbooks/status.yml", inv=inv, status_json=True)
    data = status.result_of("Print the fleet's progress.", "a")["msg"]
    assert data["hosts"]["b"]["state"].startswith("unreachable"), data["hosts"]["b"]
    assert data["hosts"]["a"]["state"] == "done" and not data["ok"]
    assert any(p.startswith("host b: unreachable") for p in data["problems"]), data["problems"]
