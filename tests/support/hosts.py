"""Real hosts for the fleet tests: systemd sandboxes, each in a network namespace of its own with
its own sshd, reached over SSH by a controller in a network namespace the test made.

The layout, all of it made here and removed by `Fleet.close` (call it from a finalizer, so a
failed test leaves nothing behind)::

    controller netns "hsx-<id>"  (ip netns add): lo, and a bridge "br0" with <net>.1/24
      |-- veth "v<k>" on br0  <-->  "eth0" in host k's netns, <net>.<10+k>/24
    host k: a Sandbox (scripts/sdbox.sh, SDBOX_NET=1: a netns of its own, only lo until the veth
            arrives) running /usr/sbin/sshd as a transient unit on <net>.<10+k>:22, root's key
            the one the test generated (nothing of the machine's own /etc/ssh is used)

The addresses are in 198.18.0.0/15, the range set aside for testing network devices (RFC 2544),
never routed here: the namespaces have no route out, so every packet stays between the test's own
namespaces. Ansible runs in the controller netns (`Fleet.playbook`), with an inventory that
names each host by its address, the generated key and a known_hosts of the hosts' keys: no local
connection, real SSH. The hosts reach each other the same way (the collector's rsync).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support import ansiballz_cache
from support.playbook_sandbox import SDBOX, PlayResult, Sandbox, play_result

SSHD = "/usr/sbin/sshd"


def missing_requirements() -> str | None:
    """Why the fleet hosts cannot be made on this machine, or None."""
    if os.geteuid() != 0:
        return "the fleet hosts need root (network namespaces, sandboxes)"
    for tool in ("ip", "ssh", "ssh-keygen", "rsync", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"the fleet hosts need {tool} (.ci/run installs it)"
    if not Path(SSHD).exists():
        return f"the fleet hosts need {SSHD} (openssh-server; .ci/run installs it)"
    if not Path("/lib/systemd/systemd").exists():
        return "the fleet hosts need systemd installed (not running)"
    for var in ("HSEXTRACT_ANSIBLE_BIN", "HSEXTRACT_VENV"):
        if not os.environ.get(var):
            return f"${var} is not set (make test sets it)"
    return None


def _run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed (rc {r.returncode}): {r.stderr.strip()}")
    return r


@dataclass
class Host:
    """One host: its inventory name, its sandbox and its address."""

    name: str
    box: Sandbox
    address: str
    home: Path  # a directory of the test's bound into this host only (its output lives there)

    def sh(self, script: str, timeout: float = 120, check: bool = True) -> str:
        return self.box.sh(script, timeout=timeout, check=check)


@dataclass
class Fleet:
    """The controller namespace, the hosts, and the SSH material (see the module docstring)."""

    root: Path  # the test's directory: keys/, and one home per host
    tag: str  # unique per fleet: the netns's and the sandboxes' names
    net: str = "198.18.7"  # the hosts' /24 (in RFC 2544's test range)
    hosts: dict[str, Host] = field(default_factory=dict)
    netns: str = ""

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    @property
    def key(self) -> Path:
        return self.keys / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.keys / "known_hosts"

    # -- making it ------------------------------------------------------------------------------

    def open(self, names: list[str], shm: str = "1g") -> Fleet:
        """The controller namespace, then each host: sandbox, veth, address, sshd; waits for SSH."""
        self.keys.mkdir(parents=True, exist_ok=True)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hsextract-test", "-f", str(self.key))
        _run(
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "hsextract-test-host",
            "-f",
            str(self.keys / "host_ed25519"),
        )
        (self.keys / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        host_key = (self.keys / "host_ed25519.pub").read_text().split()[:2]
        self.netns = f"hsx-{self.tag}"
        _run("ip", "netns", "add", self.netns)
        ns = ["ip", "-n", self.netns]
        _run(*ns, "link", "set", "lo", "up")
        _run(*ns, "link", "add", "br0", "type", "bridge", "forward_delay", "0")
        _run(*ns, "addr", "add", f"{self.net}.1/24", "dev", "br0")
        _run(*ns, "link", "set", "br0", "up")
        known = []
        for k, name in enumerate(names):
            home = self.root / name
            home.mkdir(parents=True, exist_ok=True)
            box = Sandbox(name=f"hsx-{self.tag}-{name}", binds=[self.keys, home], workdir=Path("/"), shm=shm)
            host = Host(name, box, f"{self.net}.{10 + k}", home)
            self.hosts[name] = host
            box.start()
            self._link(host, k)
            self._start_sshd(host)
            known.append(f"{host.address} {' '.join(host_key)}")
        self.known_hosts.write_text("\n".join(known) + "\n")
        for host in self.hosts.values():
            self.wait_for_ssh(host)
        return self

    def _pid(self, host: Host) -> int:
        """The host's systemd, as this machine's pid namespace sees it (its netns is the host's)."""
        out = subprocess.run([str(SDBOX), "status"], env=host.box._env(), capture_output=True, text=True).stdout
        state, _, pid = out.strip().partition(" ")
        if state != "running":
            raise RuntimeError(f"sandbox of host {host.name} is not running ({out.strip()})")
        return int(pid)

    def _link(self, host: Host, k: int) -> None:
        """A veth pair from the controller's bridge to the host's netns, where it is eth0 with its address."""
        pid = self._pid(host)
        ns = ["ip", "-n", self.netns]
        _run(*ns, "link", "add", f"v{k}", "type", "veth", "peer", "name", "eth0", "netns", str(pid))
        _run(*ns, "link", "set", f"v{k}", "master", "br0", "up")
        host.sh(f"ip addr add {host.address}/24 dev eth0 && ip link set eth0 up")

    def _start_sshd(self, host: Host) -> None:
        config = self.keys / f"sshd_config.{host.name}"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {host.address}",
                    "Port 22",
                    f"HostKey {self.keys / 'host_ed25519'}",
                    f"AuthorizedKeysFile {self.keys / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "PidFile none",
                    "Subsystem sftp internal-sftp",
                    # The modules run over SSH keep their compiled code too (support.ansiballz_cache).
                    "SetEnv " + " ".join(f"{k}={v}" for k, v in ansiballz_cache.environment().items()),
                    "",
                ]
            )
        )
        host.sh("mkdir -p /run/sshd && chmod 0755 /run/sshd")
        host.box.run("systemd-run", "--unit=hsx-test-sshd", "--quiet", SSHD, "-D", "-e", "-f", str(config), check=True)

    def ssh_args(self) -> list[str]:
        return [
            "-i",
            str(self.key),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
        ]

    def wait_for_ssh(self, host: Host, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            r = self.in_controller("ssh", *self.ssh_args(), f"root@{host.address}", "true", timeout=30, check=False)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"host {host.name} ({host.address}) does not answer SSH: {r.stderr.strip()}")
            time.sleep(0.2)

    def close(self) -> None:
        """Stop every sandbox and remove the controller namespace (idempotent; safe after a failed open)."""
        for host in self.hosts.values():
            with contextlib.suppress(Exception):  # the next host and the netns must go too
                host.box.stop()
        if self.netns:
            _run("ip", "netns", "del", self.netns, check=False)

    # -- using it -------------------------------------------------------------------------------

    def in_controller(
        self,
        *argv: str,
        timeout: float = 120,
        check: bool = True,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """Run a command in the controller's network namespace (this machine's files)."""
        r = subprocess.run(
            ["ip", "netns", "exec", self.netns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env=env,
        )
        if check and r.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} failed in the controller (rc {r.returncode}):\n{r.stdout}\n{r.stderr}"
            )
        return r

    def inventory(
        self,
        path: Path,
        host_vars: dict[str, dict[str, Any]],
        group_vars: dict[str, Any],
        groups: dict[str, list[str]] | None = None,
        names: list[str] | None = None,
    ) -> Path:
        """An inventory of the hosts `names` (default all) in group hsextract, reached over SSH at their
        addresses; `host_vars` add to (or replace) a host's, `groups` adds groups of these names."""
        names = names if names is not None else list(self.hosts)
        hosts = {}
        for n in names:
            base = self.hosts[n].address if n in self.hosts else f"{self.net}.250"
            hosts[n] = {"ansible_host": base, **host_vars.get(n, {})}
        inventory = {
            "all": {
                "vars": {
                    "ansible_user": "root",
                    "ansible_python_interpreter": "/usr/bin/python3",
                    "ansible_ssh_private_key_file": str(self.key),
                    "ansible_ssh_common_args": f"-o UserKnownHostsFile={self.known_hosts} "
                    "-o StrictHostKeyChecking=yes -o ConnectTimeout=5",
                },
                "children": {
                    "hsextract": {"hosts": hosts, "vars": group_vars},
                    **{g: {"hosts": {m: {} for m in members}} for g, members in (groups or {}).items()},
                },
            }
        }
        path.write_text(yaml.safe_dump(inventory, sort_keys=False))
        return path

    def playbook(
        self,
        repo: Path,
        inventory: Path,
        playbook: str,
        *args: str,
        extra_vars: dict[str, Any] | None = None,
        timeout: float = 1500,
        log_dir: Path | None = None,
        label: str = "play",
    ) -> PlayResult:
        """ansible-playbook from the controller namespace, with the JSON callback; never raises on a failed play."""
        ansible_bin = os.environ["HSEXTRACT_ANSIBLE_BIN"]
        argv = [f"{ansible_bin}/ansible-playbook", "-i", str(inventory), playbook, *args]
        if extra_vars:
            argv += ["-e", json.dumps(extra_vars)]
        env = {
            **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            "ANSIBLE_STDOUT_CALLBACK": "hsx_json",
            "ANSIBLE_CALLBACK_PLUGINS": str(repo / "tests" / "ansible" / "callback_plugins"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_DEPRECATION_WARNINGS": "0",
            "ANSIBLE_LOCALHOST_WARNING": "0",
            "ANSIBLE_HOST_KEY_CHECKING": "1",
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.root / "cp"),
            "PYTHONDONTWRITEBYTECODE": "1",
            **ansiballz_cache.environment(),
        }
        r = self.in_controller(*argv, timeout=timeout, check=False, cwd=repo, env=env)
        return play_result(r, log_dir, label)
