"""`ansible-playbook extract.yml` against a real systemd and a real SGLang server on CPU.

One sandbox per session is converged and then inspected by several tests; the sequence is the
life of a real host:

1. before the run, a leftover "server" (a python listener whose command line matches the reaper's
   pattern) holds the server port, and an unrelated service listens on another port;
2. ``extract.yml`` converges from nothing (services started, the run goes on in the background);
3. mid-run, the server's main process is killed with SIGKILL: systemd restarts it;
4. ``playbooks/smoke.yml`` passes against the restarted server;
5. ``extract.yml -e wait=true`` (the second run) changes nothing and waits for the run to finish;
6. ``extract.yml --check`` changes nothing;
7. the hsextract package changes and ``extract.yml`` runs again: its handlers restart the running
   server and drain, and leave the finished client alone.

After the failure cases (below), the same host runs ``extract.yml`` with the regeneration on, into
another training set: the server generates the replies in its generation profile, goes back to the
capture profile, and the extraction captures the regenerated dataset; a second run changes nothing.

Every play runs with the output and staging directories moved from their defaults, so the run
itself shows that an overridden path reaches each unit and the process it runs.

The failure cases run afterwards against the same sandbox: they fail before changing anything.
The teardown playbook runs last.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hsextract.capture.patch import server_launch
from support.client_run import lines_unsent
from support.playbook_sandbox import QUICK_WAITS, REPO, PlayResult, Sandbox, snapshot_repo

pytestmark = [pytest.mark.slow, pytest.mark.sandbox, pytest.mark.server, pytest.mark.timeout(3600)]

PORT = 30000  # inside the sandbox's own network namespace: never the host's
BYSTANDER_PORT = 30123
DATASET = REPO / "files" / "datasets" / "demo.jsonl"
RUN_CONFIG = "/etc/hsextract/run.json"
OUTPUT = "/srv/hsx-test/output"  # not the defaults: every unit and process must follow the override
DUMP_DIR = "/dev/shm/hsx-test-staging"
DEFAULT_OUTPUT, DEFAULT_DUMP_DIR = "/var/lib/hsextract/output", "/dev/shm/hsextract"
# Freezes the server once the client's log says its start-up is over; prints "frozen" if it did.
FREEZE_AFTER_START_UP = (
    "journalctl --unit=hsextract-extract.service --output=cat --no-pager --quiet | grep -q 'start-up: ' "
    "&& systemctl kill --signal=SIGSTOP hsextract-server.service && echo frozen"
)
LISTENER = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(100000)\n"
)


def _requirements() -> str | None:
    if os.geteuid() != 0:
        return "the systemd sandbox needs root"
    if not Path("/lib/systemd/systemd").exists() or not shutil.which("unshare") or not shutil.which("nsenter"):
        return "the systemd sandbox needs systemd (installed, not running) and util-linux"
    for var in ("HSEXTRACT_ANSIBLE_BIN", "HSEXTRACT_VENV"):
        if not os.environ.get(var):
            return f"${var} is not set (make test sets it: the controller venv's bin dir / the ml-env venv)"
    return None


@pytest.fixture(scope="session")
def host(tmp_path_factory):
    """A converged sandbox and the results of the sequence in the module docstring."""
    why = _requirements()
    if why:
        pytest.skip(why)
    logs = tmp_path_factory.mktemp("ansible-logs")
    repo = snapshot_repo(tmp_path_factory.mktemp("repo"))
    box = Sandbox(
        name=f"hsx-ans-{os.getpid()}-{uuid.uuid4().hex[:6]}",
        binds=[repo],
        workdir=repo,
        shm="1g",
        play_vars={"hsextract_output_dir": OUTPUT, "hsextract_dump_dir": DUMP_DIR, **QUICK_WAITS},
    )
    box.start()
    try:
        venv_python = f"{os.environ['HSEXTRACT_VENV']}/bin/python"
        box.run(
            "systemd-run",
            "--unit=hsx-test-old-server",
            "--quiet",
            venv_python,
            "-c",
            LISTENER,
            str(PORT),
            "sglang.launch_server",
            "--port",
            str(PORT),
            check=True,
        )
        box.run(
            "systemd-run",
            "--unit=hsx-test-bystander",
            "--quiet",
            venv_python,
            "-c",
            LISTENER,
            str(BYSTANDER_PORT),
            "unrelated-service",
            check=True,
        )
        box.wait_until(
            lambda: box.run("ss", "-ltn", f"sport = :{PORT}").stdout.count("LISTEN") == 1,
            30,
            interval=0.5,
            what="the old server to listen",
        )
        state: dict = {"box": box, "logs": logs, "repo": repo}
        state["old_server_pid"] = box.main_pid("hsx-test-old-server.service")
        state["bystander_pid"] = box.main_pid("hsx-test-bystander.service")

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            converge = pool.submit(box.playbook, "extract.yml", log_dir=logs, label="1-converge", timeout=1500)
            frozen_at = freeze_the_server_once_the_client_sends(box, converge)
            state["first"] = converge.result()
        if state["first"].rc == 0:
            # Kill the server mid-run (the client is still sending): systemd must bring it back.
            state["client_active_at_kill"] = box.unit("hsextract-extract.service", "ActiveState")["ActiveState"]
            state["client_at_kill"] = client_status_after(box, frozen_at) if frozen_at else {}
            killed = box.main_pid("hsextract-server.service")
            box.run("kill", "-9", str(killed), check=True)
            state["killed_pid"] = killed
            # What is left of the frozen server (its scheduler) ends as it would after the kill.
            box.run("systemctl", "kill", "--signal=SIGCONT", "hsextract-server.service")

            def restarted() -> bool:
                props = box.unit("hsextract-server.service", "NRestarts", "ActiveState")
                return int(props["NRestarts"]) >= 1 and props["ActiveState"] == "active"

            box.wait_until(
                restarted,
                600,
                what="systemd to restart the killed server and the restarted one to be healthy",
            )
            state["smoke"] = box.playbook("playbooks/smoke.yml", log_dir=logs, label="2-smoke", timeout=600)
            state["second"] = box.playbook(
                "extract.yml", extra_vars={"wait": True}, log_dir=logs, label="3-second-run-wait", timeout=1500
            )
            state["check"] = box.playbook("extract.yml", "--check", log_dir=logs, label="4-check", timeout=900)
            units = ("hsextract-server.service", "hsextract-drain.service")
            state["pids_before_update"] = {unit: box.main_pid(unit) for unit in units}
            package = repo / "files" / "python" / "hsextract" / "__init__.py"
            package.write_text(package.read_text() + "# a new version of the package\n")
            state["update"] = box.playbook("extract.yml", log_dir=logs, label="5-package-update", timeout=1500)
        yield state
    finally:
        box.stop()


def freeze_the_server_once_the_client_sends(box: Sandbox, converge: concurrent.futures.Future) -> float | None:
    """Freeze the server (SIGSTOP to every process of its unit) as the client ends its start-up,
    and return when (time.time()); None if the converge ended with no client starting.

    The converge's last task starts the client and the play returns while the client runs; on two
    busy cores the 40 demo samples could all be sent before the test's kill. Frozen once the
    client logs the end of its start-up (its probe needs the server), the server answers nothing
    more, so the kill lands while the client has lines left to send.
    """
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        ended = converge.done()
        active = box.unit("hsextract-extract.service", "ActiveState")["ActiveState"] == "active"
        if active and "frozen" in box.sh(FREEZE_AFTER_START_UP, check=False):
            return time.time()
        if ended and not active:
            return None
        time.sleep(0.05 if active else 0.5)  # the client's start-up takes seconds, the converge minutes
    raise AssertionError("the client did not end its start-up within 30 minutes of the converge's start")


def client_status_after(box: Sandbox, since: float) -> dict:
    """The client's status file once it has been written after `since` (it is written every second)."""
    path = f"{OUTPUT}/.hsextract/client-status.json"
    found: dict = {}

    def written() -> bool:
        nonlocal found
        r = box.run("cat", path)
        found = json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else {}
        return found.get("updated_at", 0) > since

    box.wait_until(written, 60, interval=0.2, what=f"the client to write {path} after the server froze")
    return found


def assert_ok(result: PlayResult, what: str) -> None:
    assert result.rc == 0, f"{what} failed (rc {result.rc}):\n{result.failure_text() or result.log[-4000:]}"


def status(box: Sandbox) -> dict:
    out = box.run(
        f"{os.environ['HSEXTRACT_VENV']}/bin/python", "-m", "hsextract", "status", "--config", RUN_CONFIG, "--json"
    ).stdout
    return json.loads(out)


def manifest_indices(box: Sandbox) -> list[int]:
    code = (
        "import json, sys\nfrom hsextract.output.manifest import iter_entries\n"
        "print(json.dumps([e.dataset_index for e in iter_entries(sys.argv[1])]))"
    )
    out = box.run(f"{os.environ['HSEXTRACT_VENV']}/bin/python", "-c", code, OUTPUT, check=True).stdout
    return json.loads(out)


# ---- the converged host ---------------------------------------------------------------------------


def test_extract_converges_from_nothing(host):
    assert_ok(host["first"], "the first extract.yml run")
    assert host["first"].changed() > 0


def test_the_settings_are_validated_once_per_play(host):
    names = [name for name, _ in host["first"].task_results()]
    for check in (
        "hsextract : Check the rid prefix, the shard, the client processes, the aux layer ids, the precision and "
        "the regenerated dataset's path with hsextract's own code.",
        "hsextract : Check the aux layer ids against the model's depth.",
    ):
        assert names.count(check) == 1, f"{check!r} ran {names.count(check)} times"
    specs = [n for n in names if n.startswith("hsextract : Validating arguments against arg spec")]
    assert len(specs) == 1, specs


def test_the_play_sizes_the_run_from_the_dataset_before_starting_it(host):
    assert_ok(host["first"], "the first extract.yml run")
    lines = host["first"].result_of("Stop when the output volume cannot hold the training set.")["msg"]
    assert "samples   40 of 40 rows" in lines and "output    room" in lines


def test_a_leftover_server_on_the_port_is_reaped_and_reported(host):
    box = host["box"]
    report = json.loads(host["first"].result_of("Stop the leftover servers on port 30000.")["stdout"])
    assert [s["pid"] for s in report["stopped"]] == [host["old_server_pid"]]
    assert "sglang.launch_server" in report["stopped"][0]["cmdline"] and report["port_free"] is True
    assert box.unit("hsx-test-old-server.service", "ActiveState")["ActiveState"] != "active"


def test_an_unrelated_listener_on_another_port_survives(host):
    box = host["box"]
    assert box.unit("hsx-test-bystander.service", "MainPID", "ActiveState") == {
        "MainPID": str(host["bystander_pid"]),
        "ActiveState": "active",
    }


def test_the_server_runs_with_the_capture_flags_and_hardening(host):
    box = host["box"]
    props = box.unit(
        "hsextract-server.service",
        "ExecStart",
        "Environment",
        "NoNewPrivileges",
        "ProtectSystem",
        "PrivateTmp",
        "Restart",
        "KillMode",
        "UnitFileState",
    )
    # Every flag the capture's own launch helper sets, plus this run's settings.
    capture_flags = server_launch("patch", device="cpu").args
    for flag in (*capture_flags, "--host 127.0.0.1", f"--port {PORT}", "--chunked-prefill-size 64", "--device cpu"):
        assert flag in props["ExecStart"].replace(" ; ", " "), f"{flag} missing from {props['ExecStart']}"
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE=hsextract_capture_patch" in props["Environment"]
    assert "SGLANG_USE_CPU_ENGINE=1" in props["Environment"]
    assert (props["NoNewPrivileges"], props["ProtectSystem"], props["PrivateTmp"]) == ("yes", "strict", "yes")
    assert (props["Restart"], props["KillMode"], props["UnitFileState"]) == ("on-failure", "mixed", "enabled")
    assert box.unit("hsextract-drain.service", "Restart", "ActiveState") == {
        "Restart": "always",
        "ActiveState": "active",
    }


def test_the_overridden_output_and_staging_directories_reach_every_unit_and_its_process(host):
    assert_ok(host["second"], "the second extract.yml run (-e wait=true)")
    box = host["box"]
    for unit, paths in (
        ("hsextract-server.service", {DUMP_DIR}),
        ("hsextract-drain.service", {DUMP_DIR, OUTPUT}),
        ("hsextract-extract.service", {DUMP_DIR, OUTPUT}),
    ):
        granted = {p.lstrip("-") for p in box.unit(unit, "ReadWritePaths")["ReadWritePaths"].split()}
        assert paths <= granted, f"{unit} grants {granted}, expected {paths}"
    # The processes: the capture stages where the unit lets it, the drain and the client write their
    # status files, the manifest and the summary there, and nothing goes to the default places.
    code = "import json, hsextract_capture_patch as p; print(json.dumps(p.CONFIG))"
    capture = json.loads(
        box.run(
            f"{os.environ['HSEXTRACT_VENV']}/bin/python",
            "-c",
            code,
            check=True,
            env={"PYTHONPATH": "/var/lib/hsextract/capture-patch"},
        ).stdout
    )
    assert capture["dump_dir"] == DUMP_DIR, capture
    for name in ("manifest.json", "manifest.jsonl", ".hsextract/drain-status.json", ".hsextract/client-summary.json"):
        assert box.run("test", "-f", f"{OUTPUT}/{name}").returncode == 0, f"{OUTPUT}/{name} is missing"
    assert box.run("test", "-e", DEFAULT_OUTPUT).returncode == 1, f"something wrote to {DEFAULT_OUTPUT}"
    assert box.run("test", "-e", DEFAULT_DUMP_DIR).returncode == 1, f"something staged in {DEFAULT_DUMP_DIR}"


def test_systemd_restarts_the_server_after_kill_9_and_the_smoke_test_passes_again(host):
    assert host.get("killed_pid", 0) > 1
    assert host["client_active_at_kill"] == "active", "the kill should land while the client is sending"
    st = host["client_at_kill"]
    assert lines_unsent(st) > 0, f"the kill should land while the client has lines to send: {st}"
    assert_ok(host["smoke"], "playbooks/smoke.yml after the restart")
    assert host["box"].main_pid("hsextract-server.service") != host["killed_pid"]


def test_the_smoke_tests_self_check_compares_the_probes_logprobs_with_the_servers_own(host):
    for play in ("first", "smoke"):  # the converge's smoke test, and playbooks/smoke.yml after the restart
        verdict = json.loads(host[play].result_of("Run the capture's self-check on the dump.")["stdout"])
        numbers = verdict["details"].get("logprobs")
        assert verdict["ok"] and numbers and numbers["positions"] == 10, f"{play}: {verdict}"
        assert numbers["mean_abs_error"] <= numbers["bound"], f"{play}: {numbers}"


def test_the_second_run_changes_nothing_and_waits_for_a_complete_training_set(host):
    assert_ok(host["second"], "the second extract.yml run (-e wait=true)")
    assert host["second"].changed() == 0, f"changed tasks: {host['second'].changed_tasks()}"
    summary = host["second"].result_of("Print the summary and where the training set is.")["msg"].splitlines()
    expected = sum(1 for line in DATASET.read_text().splitlines() if line.strip())
    assert summary[0] == f"The run is done: {expected} samples are in the training set.", summary
    # The column is as wide as the longest label: "stale removed" widens it when the restarted
    # server's resent samples were written already (nothing lost, and said so).
    assert any(re.fullmatch(rf"  training set +{re.escape(OUTPUT)} \(speculators\)", line) for line in summary), summary
    assert f"{expected} accepted = {expected} in the set + 0 failed + 0 quarantined" in "\n".join(summary), summary
    check = host["second"].result_of(
        "Check that every accepted sample is in the training set, the failures or the quarantine."
    )
    assert not check.get("failed"), check


def test_the_training_set_holds_every_sample_exactly_once_despite_the_crash(host):
    box = host["box"]
    expected = sum(1 for line in DATASET.read_text().splitlines() if line.strip())
    indices = manifest_indices(box)
    assert sorted(indices) == list(range(expected)), f"expected each of {expected} samples once, got {sorted(indices)}"
    st = status(box)
    assert st["client"]["state"] == "done" and st["client"]["failed"] == 0
    assert st["drain"]["quarantined"] == 0 and st["drain"]["lag"] == 0


def test_check_mode_on_the_converged_host_changes_nothing(host):
    assert_ok(host["check"], "extract.yml --check")
    assert host["check"].changed() == 0, f"changed tasks: {host['check'].changed_tasks()}"


def test_a_new_package_restarts_the_running_server_and_drain_and_leaves_the_finished_client(host):
    assert_ok(host["update"], "extract.yml after the package changed")
    box = host["box"]
    changed = [name for name in host["update"].changed_tasks() if not name.startswith("ml_env : ")]
    assert changed == [
        "service_handlers : Restart the server if it is running.",
        "service_handlers : Restart the drain daemon if it is running.",
    ], host["update"].changed_tasks()
    for unit, pid in host["pids_before_update"].items():
        assert box.main_pid(unit) != pid, f"{unit} still runs the process of the old package"
    assert box.unit("hsextract-server.service", "ActiveState")["ActiveState"] == "active"


def test_the_client_unit_finished_cleanly_and_is_not_restarted(host):
    props = host["box"].unit("hsextract-extract.service", "ActiveState", "Result", "UnitFileState")
    assert props == {"ActiveState": "inactive", "Result": "success", "UnitFileState": "enabled"}


def test_the_status_playbook_shows_the_progress_without_changing_anything(host):
    if host["first"].rc != 0:
        pytest.skip("the converge failed")
    result = host["box"].playbook("playbooks/status.yml", log_dir=host["logs"], label="status", timeout=300)
    assert_ok(result, "playbooks/status.yml")
    assert result.changed() == 0
    lines = result.result_of("Print the progress.")["msg"].splitlines()
    assert lines[0] == "Services (server, drain, client): active, active, inactive"
    assert lines[1].startswith("The run is done: "), lines


# ---- failures: they stop the play before anything changes ---------------------------------------


def failing_run(host, label: str, *args: str, extra_vars: dict | None = None) -> PlayResult:
    box = host["box"]
    if host["first"].rc != 0:
        pytest.skip("the converge failed; see test_extract_converges_from_nothing")
    result = box.playbook("extract.yml", *args, extra_vars=extra_vars, log_dir=host["logs"], label=label, timeout=600)
    assert result.rc != 0, f"{label}: the play should have failed"
    assert result.changed() == 0, f"{label}: a failing play changed {result.changed_tasks()}"
    return result


def test_an_unknown_format_fails_argument_validation_naming_the_variable(host):
    result = failing_run(host, "bad-format", extra_vars={"hsextract_format": "parquet"})
    text = result.failure_text()
    assert "hsextract_format" in text and "parquet" in text and "speculators" in text


def test_layers_out_of_range_fail_at_the_first_tasks_naming_the_variable(host):
    result = failing_run(host, "bad-layers", extra_vars={"hsextract_aux_layer_ids": [1, 3, 40]})
    text = result.failure_text()
    assert "hsextract_aux_layer_ids=[1, 3, 40]" in text and "8 layers" in text and "[0, 6]" in text


def test_a_missing_model_path_fails_naming_the_variable(host):
    result = failing_run(
        host, "missing-model", extra_vars={"hsextract_model_path": "/nonexistent/model", "hsextract_tiny_model": ""}
    )
    text = result.failure_text()
    assert "hsextract_model_path=/nonexistent/model" in text and "config.json" in text


def test_a_non_matching_process_on_the_port_fails_the_play_with_its_pid(host):
    box = host["box"]
    venv_python = f"{os.environ['HSEXTRACT_VENV']}/bin/python"
    box.run(
        "systemd-run",
        "--unit=hsx-test-stranger",
        "--quiet",
        venv_python,
        "-c",
        LISTENER,
        "30555",
        "some-other-daemon",
        check=True,
    )
    try:
        box.wait_until(
            lambda: "LISTEN" in box.run("ss", "-ltn", "sport = :30555").stdout,
            30,
            interval=0.5,
            what="the stranger to listen",
        )
        pid = box.main_pid("hsx-test-stranger.service")
        result = failing_run(host, "stranger-on-port", "--tags", "port_reaper", extra_vars={"port_reaper_port": 30555})
        text = result.failure_text()
        assert f"pid {pid}" in text and "some-other-daemon" in text
        assert box.unit("hsx-test-stranger.service", "MainPID")["MainPID"] == str(pid)
    finally:
        box.run("systemctl", "stop", "hsx-test-stranger.service")


def test_a_dev_shm_too_small_fails_shm_guard_with_the_numbers(host):
    box = host["box"]
    box.sh("mount -o remount,size=8m /dev/shm")
    try:
        result = failing_run(host, "small-shm", "--tags", "shm_guard")
    finally:
        box.sh("mount -o remount,size=1g /dev/shm")
    text = result.failure_text()
    assert re.search(rf"{DUMP_DIR} has [0-9.]+ (KiB|MiB) free \(of 8\.0 MiB\)", text), text
    assert "the run needs 16.0 MiB" in text
    assert "hsextract_shm_min_free" in text


def test_an_output_volume_too_small_stops_the_play_at_the_plan_with_the_numbers(host):
    result = failing_run(host, "no-room", "--tags", "plan", extra_vars={"plan_space_margin": "1000T"})
    text = result.failure_text()
    assert f"{OUTPUT} has " in text and "but the run needs" in text, text
    assert "speculators training set" in text and "plan_space_margin" in text


# ---- the regeneration stage (hsextract_regenerate), on the converged host --------------------------

REGEN_OUTPUT = "/srv/hsx-test/output-regen"  # a training set of its own: the other one stays as it is
REGENERATED = "/srv/hsx-test/regenerated"
REGEN_VARS = {
    "hsextract_regenerate": True,
    "hsextract_output_dir": REGEN_OUTPUT,
    "hsextract_regenerated_dir": REGENERATED,
    "regeneration_max_new_tokens": 16,
    "regeneration_concurrency": 8,
    "wait": True,
}
ENCODE = """import json, sys
from hsextract.dataset.chat_template import SampleEncoder, load_tokenizer
from hsextract.dataset.reader import Sample, read_dataset
encoder = SampleEncoder(load_tokenizer(sys.argv[1]), int(sys.argv[3]), "truncate")
print(json.dumps({item.index: getattr(encoder.encode(item), "input_ids", None) for item in read_dataset(sys.argv[2])
                  if isinstance(item, Sample)}))
"""


@pytest.fixture(scope="session")
def regen_host(host):
    """extract.yml with the regeneration on (from the converged host): in check mode, then twice; copied out."""
    if host["first"].rc != 0:
        pytest.skip("the converge failed")
    box, logs = host["box"], host["logs"]
    state: dict = {"box": box, "server_pid_before": box.main_pid("hsextract-server.service")}
    state["check"] = box.playbook(
        "extract.yml", "--check", extra_vars=REGEN_VARS, log_dir=logs, label="6-regenerate-check", timeout=900
    )
    state["server_pid_after_check"] = box.main_pid("hsextract-server.service")
    unit_file = "/etc/systemd/system/hsextract-regenerate.service"
    state["left_by_check"] = box.sh(f"ls -d {REGENERATED} {REGEN_OUTPUT} {unit_file} 2>/dev/null || true")
    state["first"] = box.playbook(
        "extract.yml", extra_vars=REGEN_VARS, log_dir=logs, label="7-regenerate", timeout=1800
    )
    if state["first"].rc == 0:
        state["server_pid"] = box.main_pid("hsextract-server.service")
        state["regen_started"] = box.unit("hsextract-regenerate.service", "ExecMainStartTimestamp")
        state["second"] = box.playbook(
            "extract.yml", extra_vars=REGEN_VARS, log_dir=logs, label="8-regenerate-again", timeout=900
        )
    export = host["repo"] / ".regen-export"  # the snapshot is bound into the sandbox: the host reads it there
    box.sh(
        f"rm -rf {export} && mkdir -p {export} && cp -a {REGEN_OUTPUT} {export}/output && "
        f"cp -a {REGENERATED} {export}/regenerated",
        check=False,
    )
    state["output"], state["regenerated"] = export / "output", export / "regenerated"
    return state


def source_conversations() -> dict[str, list[dict]]:
    """id -> the assistant turns of each conversation of the demo dataset (pre-tokenized rows have none)."""
    out = {}
    for line in DATASET.read_text().splitlines():
        row = json.loads(line)
        turns = row.get("messages") or row.get("conversations")
        if turns:
            out[row["id"]] = [t for t in turns if t.get("role", t.get("from")) in ("assistant", "gpt")]
    return out


def regenerated_rows(regen_host) -> list[dict]:
    return [json.loads(line) for line in (regen_host["regenerated"] / "conversations.jsonl").read_text().splitlines()]


def test_check_mode_with_the_regeneration_to_do_changes_nothing_on_the_host(regen_host):
    assert_ok(regen_host["check"], "extract.yml --check with hsextract_regenerate")
    assert "regeneration : Install the regeneration unit." in [
        name for name, _ in regen_host["check"].task_results()
    ], "check mode skipped the regeneration"
    assert regen_host["server_pid_after_check"] == regen_host["server_pid_before"], "check mode restarted the server"
    assert regen_host["left_by_check"] == "", f"check mode created {regen_host['left_by_check']}"


def test_extract_with_regeneration_generates_first_then_captures_with_the_capture_profile(regen_host):
    assert_ok(regen_host["first"], "extract.yml with hsextract_regenerate")
    box = regen_host["box"]
    done = regen_host["first"].result_of("Print the regeneration's summary.")["msg"]
    written = len(regenerated_rows(regen_host))
    assert done.startswith(f"The regeneration is done: {written} conversations regenerated of "), done
    assert f"; {written} in this pass)" in done, done
    assert done.endswith(f"The extraction reads {REGENERATED}."), done
    assert box.unit("hsextract-regenerate.service", "ActiveState", "Result") == {
        "ActiveState": "inactive",
        "Result": "success",
    }
    props = box.unit("hsextract-server.service", "ExecStart", "Environment", "NRestarts")
    assert "--disable-radix-cache" in props["ExecStart"], "the server was not put back in the capture profile"
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE=hsextract_capture_patch" in props["Environment"]
    run = json.loads(box.run("cat", RUN_CONFIG, check=True).stdout)
    assert (run["dataset"], run["output"]) == (REGENERATED, REGEN_OUTPUT)


def test_the_regenerated_dataset_has_one_outcome_per_row_and_the_models_own_replies(regen_host):
    assert_ok(regen_host["first"], "extract.yml with hsextract_regenerate")
    source, rows = source_conversations(), regenerated_rows(regen_host)
    errors = [
        json.loads(line)
        for line in (regen_host["regenerated"] / ".hsextract" / "regen-errors.jsonl").read_text().splitlines()
    ]
    # The tiny random model sometimes ends a reply at once: such a conversation is an error (empty_reply)
    # or is cut before that turn; every other reply is the model's own.
    outcomes = [r["regenerated"]["index"] for r in rows] + [e["index"] for e in errors]
    assert sorted(outcomes) == list(range(40)), "one outcome per row of the dataset"
    assert sorted(e["index"] for e in errors if e["reason"] == "pre_tokenized") == [
        i for i, line in enumerate(DATASET.read_text().splitlines()) if "input_ids" in json.loads(line)
    ]
    assert {e["reason"] for e in errors} <= {"pre_tokenized", "empty_reply"}, errors
    assert len(rows) >= 10, f"only {len(rows)} of 30 conversations regenerated"
    for row in rows:
        replies = [m for m in row["messages"] if m["role"] == "assistant"]
        full = source[row["id"]]
        assert len(replies) == row["regenerated"]["turns"] >= 1, row
        assert len(replies) == len(full) if row["regenerated"]["cut"] is None else len(replies) < len(full), row
        assert all(m["content"] != t.get("content", t.get("value")) for m, t in zip(replies, full, strict=False)), row


def test_the_training_set_of_the_regenerated_dataset_is_complete_and_loads_with_the_reader(regen_host):
    assert_ok(regen_host["first"], "extract.yml with hsextract_regenerate")
    readers = os.environ.get("HSEXTRACT_READERS")
    if not readers:
        pytest.skip("HSEXTRACT_READERS is not set: install requirements/readers.txt (make venv)")
    from hsextract.output.manifest import iter_entries
    from support.reader_check import load_with_reader

    box, out = regen_host["box"], regen_host["output"]
    entries = sorted(iter_entries(out), key=lambda e: e.output_index)
    rows = regenerated_rows(regen_host)
    assert sorted(e.dataset_index for e in entries) == list(range(len(rows))), "each regenerated row once"
    st = status(box)
    assert st["client"]["state"] == "done" and st["client"]["failed"] == 0 and st["drain"]["quarantined"] == 0
    # The drain writes the Arrow dataset after a minute idle; the copy gets it as any copied directory does.
    finalized = subprocess.run(
        [sys.executable, "-m", "hsextract", "finalize", "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert finalized.returncode == 0, finalized.stderr
    loaded = load_with_reader(Path(readers), "speculators", out, num_aux=3, hidden=64)
    assert loaded["error_records"] == 0 and sorted(loaded["samples"]) == [e.output_index for e in entries]
    # The hidden states are those of the regenerated conversations, as the client encodes them.
    run = json.loads(box.run("cat", RUN_CONFIG, check=True).stdout)
    encoded = json.loads(
        box.run(
            f"{os.environ['HSEXTRACT_VENV']}/bin/python",
            "-c",
            ENCODE,
            run["model"],
            REGENERATED,
            str(run["max_tokens"]),
            check=True,
        ).stdout
    )
    for e in entries:
        assert loaded["samples"][e.output_index]["input_ids"].tolist() == encoded[str(e.dataset_index)], e


def test_a_second_run_with_the_regeneration_done_changes_nothing(regen_host):
    assert_ok(regen_host["first"], "extract.yml with hsextract_regenerate")
    second, box = regen_host["second"], regen_host["box"]
    assert_ok(second, "the second extract.yml run with hsextract_regenerate")
    assert second.changed() == 0, f"changed tasks: {second.changed_tasks()}"
    assert box.main_pid("hsextract-server.service") == regen_host["server_pid"], "the server was restarted"
    assert box.unit("hsextract-regenerate.service", "ExecMainStartTimestamp") == regen_host["regen_started"]


# ---- several client processes (after the regeneration's tests: it changes the client's units) -------

TWO_PROCESSES = {"hsextract_client_processes": 2}
INSTANCES = ("hsextract-extract@0.service", "hsextract-extract@1.service")


@pytest.fixture(scope="session")
def two_processes_host(host):
    """The converged host's run again with two client processes (each on a sub-shard of the one
    output), waited for; then once more."""
    if host["first"].rc != 0:
        pytest.skip("the converge failed")
    box, logs = host["box"], host["logs"]
    state: dict = {"box": box}
    state["first"] = box.playbook(
        "extract.yml", extra_vars={**TWO_PROCESSES, "wait": True}, log_dir=logs, label="8a-two-processes", timeout=1500
    )
    if state["first"].rc == 0:
        state["instances"] = {u: box.unit(u, "ActiveState", "Result", "UnitFileState") for u in INSTANCES}
        state["one_process_unit"] = box.unit("hsextract-extract.service", "LoadState")["LoadState"]
        state["status"] = status(box)
        state["second"] = box.playbook(
            "extract.yml", extra_vars=TWO_PROCESSES, log_dir=logs, label="8b-two-processes-again", timeout=900
        )
    return state


def test_two_client_processes_run_as_instances_of_a_template_unit_and_finish(two_processes_host):
    assert_ok(two_processes_host["first"], "extract.yml with hsextract_client_processes: 2")
    for unit, props in two_processes_host["instances"].items():
        assert props == {"ActiveState": "inactive", "Result": "success", "UnitFileState": "enabled"}, (unit, props)
    assert two_processes_host["one_process_unit"] == "not-found", "the one-process unit is still installed"


def test_two_client_processes_share_one_output_with_exact_accounts(two_processes_host):
    assert_ok(two_processes_host["first"], "extract.yml with hsextract_client_processes: 2")
    st = two_processes_host["status"]
    expected = sum(1 for line in DATASET.read_text().splitlines() if line.strip())
    assert st["client"]["shards"] == ["0/2", "1/2"], st["client"]
    assert st["client"]["state"] == "done" and st["ok"], st
    assert sorted(manifest_indices(two_processes_host["box"])) == list(range(expected))


def test_a_second_run_with_two_client_processes_changes_nothing(two_processes_host):
    assert_ok(two_processes_host["second"], "the second extract.yml run with hsextract_client_processes: 2")
    assert two_processes_host["second"].changed() == 0, two_processes_host["second"].changed_tasks()


# ---- teardown (last: it ends the converged host) --------------------------------------------------


def test_teardown_stops_the_services_removes_the_capture_and_keeps_the_training_set(host):
    box = host["box"]
    if host["first"].rc != 0:
        pytest.skip("the converge failed")
    before = manifest_indices(box)
    result = box.playbook("playbooks/teardown.yml", log_dir=host["logs"], label="9-teardown", timeout=600)
    assert_ok(result, "playbooks/teardown.yml")
    for unit in (
        "hsextract-server.service",
        "hsextract-drain.service",
        "hsextract-extract.service",
        *INSTANCES,
        "hsextract-regenerate.service",
    ):
        assert box.unit(unit, "LoadState")["LoadState"] == "not-found", f"{unit} is still installed"
    assert box.run("test", "-e", "/etc/systemd/system/hsextract-extract@.service").returncode == 1, (
        "the client processes' template unit is still installed"
    )
    assert box.run("test", "-e", "/var/lib/hsextract/capture-patch/hsextract_capture_patch").returncode == 1
    assert box.run("test", "-e", DUMP_DIR).returncode == 1
    assert manifest_indices(box) == before
