"""Drive scripts/sdbox.sh and ansible-playbook inside it, for the playbook tests.

The sandbox is a real systemd as PID 1 in its own pid/mount/cgroup/net namespaces on an overlay of
the host root (see scripts/sdbox.sh): units really start, restart and fail, ports exist only
inside, and nothing the play writes outside the bound directories survives the sandbox.
The controller (ansible-playbook from ``$HSEXTRACT_ANSIBLE_BIN``) runs inside it too, against
``localhost`` with a local connection, exactly as ``make extract`` does on a machine without systemd.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support import ansiballz_cache
from support.tiers import refuse_in_fast_tier

REPO = Path(__file__).resolve().parents[2]
SDBOX = REPO / "scripts" / "sdbox.sh"


# The roles' settings that only make a test wait: production restarts a crashed server after 10 s
# (a test kills it and waits for the restart) and polls a run or a regeneration every 10 s (the
# tiny runs of the tests end seconds after the play starts waiting). The /health poll stays at its
# 5 s: a server start takes a minute on the suite's two busy cores, and each poll costs it CPU.
QUICK_WAITS = {"sglang_server_restart_sec": 1, "extraction_wait_delay": 2, "regeneration_wait_delay": 2}


@dataclass
class PlayResult:
    """One ansible-playbook run: exit status, per-host stats and the JSON callback's task results."""

    rc: int
    stats: dict[str, Any]
    plays: list[dict[str, Any]]
    log: str

    def changed(self, host: str = "localhost") -> int:
        return int(self.stats.get(host, {}).get("changed", 0))

    def failed_tasks(self, host: str = "localhost") -> list[tuple[str, dict[str, Any]]]:
        return [(name, r) for name, r in self.task_results(host) if r.get("failed")]

    def changed_tasks(self, host: str = "localhost") -> list[str]:
        return [name for name, r in self.task_results(host) if r.get("changed")]

    def task_results(self, host: str = "localhost") -> list[tuple[str, dict[str, Any]]]:
        out = []
        for play in self.plays:
            for task in play.get("tasks", []):
                result = task.get("hosts", {}).get(host)
                if result is not None:
                    out.append((task["task"]["name"], result))
        return out

    def result_of(self, task_name: str, host: str = "localhost") -> dict[str, Any]:
        """The result of the task named ``task_name`` (role tasks are reported as "role : name")."""
        for name, r in self.task_results(host):
            if name == task_name or name.endswith(f" : {task_name}"):
                return r
        raise KeyError(f"no task named {task_name!r} ran; tasks: {[n for n, _ in self.task_results(host)]}")

    def failure_text(self) -> str:
        parts = []
        for name, r in self.failed_tasks():
            parts.append(f"{name}: {r.get('msg', '')} {r.get('stderr', '')}")
        return "\n".join(parts)


def play_result(r: subprocess.CompletedProcess, log_dir: Path | None, label: str) -> PlayResult:
    """The result of an ansible-playbook run under the hsx_json callback; its output kept as
    ``log_dir/<label>.json`` where a log directory is given."""
    log = r.stdout + "\n--- stderr ---\n" + r.stderr
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{label}.json").write_text(log)
    try:
        data = json.loads(r.stdout[r.stdout.index("{") :])
    except ValueError:
        data = {}
    return PlayResult(r.returncode, data.get("stats", {}), data.get("plays", []), log)


def snapshot_repo(dest: Path) -> Path:
    """Copy the working tree (tracked and untracked, not ignored files) to ``dest``.

    The playbooks ship files/python to the host and reinstall it when it changes; a snapshot keeps
    a long test session independent of edits made to the working tree meanwhile.
    """
    names = (
        subprocess.run(
            ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, check=True, capture_output=True
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, names):
        src = REPO / name
        if not src.is_file():
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return dest


@dataclass
class Sandbox:
    name: str
    binds: list[Path]
    workdir: Path = REPO
    shm: str = "1g"
    env: dict[str, str] = field(default_factory=dict)
    play_vars: dict[str, Any] = field(default_factory=dict)  # extra vars of every playbook run in it
    started: bool = False

    def _env(self) -> dict[str, str]:
        # Without the test run's PYTHONPATH: what the play runs must import the hsextract it installed
        # from the snapshot, not the working tree's (visible in the sandbox through its overlay).
        return {
            **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            "SDBOX_NAME": self.name,
            # The AnsiballZ code cache too: the plays in one sandbox, and the hosts of a fleet, share it.
            "SDBOX_BINDS": " ".join(str(b) for b in [*self.binds, ansiballz_cache.root()]),
            "SDBOX_NET": "1",
            "SDBOX_SHM": self.shm,
        }

    def start(self) -> None:
        refuse_in_fast_tier("a systemd sandbox", "sandbox")
        r = subprocess.run([str(SDBOX), "start"], env=self._env(), capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"sandbox {self.name} did not start:\n{r.stdout}\n{r.stderr}")
        self.started = True

    def stop(self) -> None:
        subprocess.run([str(SDBOX), "stop"], env=self._env(), capture_output=True, text=True, timeout=120)
        self.started = False

    def run(
        self, *argv: str, timeout: float = 120, check: bool = False, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        """Run a command inside the sandbox (cwd: ``workdir``, the repository or its snapshot)."""
        cmd = [str(SDBOX), "exec"]
        if env:
            cmd += ["env", *(f"{k}={v}" for k, v in env.items())]
        r = subprocess.run(
            [*cmd, *argv], env=self._env(), cwd=self.workdir, capture_output=True, text=True, timeout=timeout
        )
        if check and r.returncode != 0:
            raise AssertionError(
                f"{shlex.join(argv)} failed in the sandbox (rc {r.returncode}):\n{r.stdout}\n{r.stderr}"
            )
        return r

    def sh(self, script: str, timeout: float = 120, check: bool = True) -> str:
        return self.run("/bin/sh", "-c", script, timeout=timeout, check=check).stdout

    def unit(self, unit: str, *props: str) -> dict[str, str]:
        out = self.run("systemctl", "show", unit, *(f"--property={p}" for p in props), check=True).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def main_pid(self, unit: str) -> int:
        """The unit's MainPID inside the sandbox; refuses 0 and 1 (kill -9 0 would hit the caller's group)."""
        pid = int(self.unit(unit, "MainPID")["MainPID"])
        assert pid > 1, f"{unit} has no main process (MainPID={pid})"
        return pid

    def wait_until(self, predicate, timeout: float, interval: float = 2.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")

    def playbook(
        self,
        playbook: str,
        *args: str,
        extra_vars: dict[str, Any] | None = None,
        timeout: float = 900,
        log_dir: Path | None = None,
        label: str = "play",
    ) -> PlayResult:
        """Run ansible-playbook inside the sandbox with the JSON callback; never raises on a failed play."""
        ansible_bin = os.environ["HSEXTRACT_ANSIBLE_BIN"]
        argv = [f"{ansible_bin}/ansible-playbook", playbook, *args]
        if self.play_vars or extra_vars:
            argv += ["-e", json.dumps({**self.play_vars, **(extra_vars or {})})]
        env = {
            "ANSIBLE_STDOUT_CALLBACK": "hsx_json",
            # From the working directory: the sandbox sees only its binds under /tmp (a CI clone may live there).
            "ANSIBLE_CALLBACK_PLUGINS": str(self.workdir / "tests" / "ansible" / "callback_plugins"),
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_DEPRECATION_WARNINGS": "0",
            "HSEXTRACT_VENV": os.environ["HSEXTRACT_VENV"],
            "PYTHONDONTWRITEBYTECODE": "1",
            **ansiballz_cache.environment(),
            **self.env,
        }
        r = self.run(*argv, timeout=timeout, env=env)
        return play_result(r, log_dir, label)
